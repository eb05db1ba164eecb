"""The strategy source in force as a record a joiner makes it again from (kungfu_tf/strategy/source_record.py).

One process: the record round-trips every registered builder with non-default settings (the joiner's
builder makes the same strategy bytes as the members', which is what the consensus at its admission
checks), a builder class of the script's own module, and says ``written`` / ``opaque`` where a builder
cannot be made again; bad records raise a ``StrategyError`` naming the cause. The multi-worker behaviour
is in tests/test_strategy_switch_join.py.
"""

from __future__ import annotations

import json

import pytest

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.builders.base import StrategyBuilder, ps_node
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.source_record import source_from_record, source_record
from kungfu_tf.strategy.variable_info import VariableInfo

VARIABLES = [VariableInfo("emb", (64, 8), sparse=True), VariableInfo("w", (32, 16)), VariableInfo("b", (16,))]


class LastRankOwnsAll(StrategyBuilder):
    """A builder of the user's own, as a script defines it at module level."""

    name = "last-rank"

    def __init__(self, offset: int = 0) -> None:
        self.offset = offset

    def nodes(self, variables, cluster):
        return [ps_node(v.name, cluster.replicas - 1 - self.offset) for v in variables]


class KeepsItsSettingsElsewhere(StrategyBuilder):
    name = "elsewhere"

    def __init__(self, owner: int = 0) -> None:
        self._owner = owner

    def nodes(self, variables, cluster):
        return [ps_node(v.name, self._owner) for v in variables]


NON_DEFAULT = [
    builders.AllReduce(chunk_size=2, compressor="fp16"),
    builders.PS(owner=1, staleness=2),
    builders.PSLoadBalancing(sync=False),
    builders.PartitionedPS(min_partition_bytes=64),
    builders.UnevenPartitionedPS(min_partition_bytes=128, staleness=1),
    builders.PartitionedAR(min_partition_bytes=64, topology="RING"),
    builders.Parallax(chunk_size=1, min_partition_bytes=64),
    LastRankOwnsAll(offset=1),
]


@pytest.mark.parametrize("builder", NON_DEFAULT, ids=lambda b: type(b).__name__)
def test_a_builder_made_again_from_its_record_makes_the_same_strategy(builder):
    record = json.loads(json.dumps(source_record(builder)))  # what travels: JSON
    again = source_from_record(record)
    assert type(again) is type(builder) and again is not builder
    for size in (2, 3, 4):
        cluster = ClusterSpec(size)
        assert canonical_bytes(again.build(VARIABLES, cluster)) == canonical_bytes(builder.build(VARIABLES, cluster))


def test_a_registered_builder_is_named_and_a_users_class_by_module_and_qualname():
    assert source_record("PSLoadBalancing") == {"builder": "PSLoadBalancing", "options": {}}
    assert source_record(builders.PS(owner=2)) == {"builder": "PS", "options": {"owner": 2, "sync": True, "staleness": 0}}
    assert source_record(LastRankOwnsAll(offset=1)) == {
        "builder": f"{__name__}:LastRankOwnsAll", "options": {"offset": 1}
    }


def test_written_strategies_and_undescribable_builders():
    assert source_record(strategy_pb2.Strategy(id="x")) == {"written": True}
    assert source_record("/some/strategy.pbtxt") == {"written": True}
    # A search holds state: not its settings but its results go to a joiner (none before one ended).
    auto = builders.Auto(budget=2)
    assert source_record(auto) == {"auto": {"settings": auto.search_settings(), "results": []}}
    elsewhere = source_record(KeepsItsSettingsElsewhere(owner=1))
    assert "__init__ takes 'owner' but the builder has no attribute of that name" in elsewhere["opaque"], elsewhere

    def local() -> StrategyBuilder:
        class Local(LastRankOwnsAll):
            pass

        return Local()

    assert "defined inside a function" in source_record(local())["opaque"]


@pytest.mark.parametrize(
    ("record", "cause"),
    [
        ({"written": True}, "names no builder"),
        ({"builder": "no_such_module_xyz:Thing", "options": {}}, "cannot be imported here: No module named"),
        ({"builder": f"{__name__}:NoSuchClass", "options": {}}, "cannot be imported here"),
        ({"builder": "json:JSONDecoder", "options": {}}, "is not a StrategyBuilder here"),
        ({"builder": "PS", "options": {"owner": 1, "colour": "red"}}, "refused its options"),
        ({"builder": "PS", "options": {"staleness": -1}}, "staleness must be >= 0"),
    ],
)
def test_a_record_that_cannot_be_made_again_names_the_cause(record, cause):
    with pytest.raises(StrategyError, match=cause):
        source_from_record(record)
