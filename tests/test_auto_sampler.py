"""The guided sampler: deterministic, distinct, valid, compilable, and AutoDist's three constraints hold.

The models are the repository's own (models/registry.py), described as the
optimizer would describe them; each constraint is checked from the sampled
strategies' resolved nodes, independently of how the sampler made them.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import pytest
from conftest import REPO_ROOT

from kungfu_tf.strategy.auto.sampler import (
    SamplerOptions,
    balanced_groups,
    sample_strategies,
)
from kungfu_tf.strategy.builders import BUILDERS
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.validation import effective_nodes, validate
from kungfu_tf.strategy.variable_info import VariableInfo

MODELS = ("ncf", "bert-small", "comm-heavy-mlp", "resnet20")
CLUSTERS = (ClusterSpec(4), ClusterSpec.uniform(4, num_hosts=2), ClusterSpec(3))
COUNT = 30
# Small enough that mid-size variables of every model fall between the thresholds.
OPTIONS = SamplerOptions(min_partition_bytes=64 * 1024, always_partition_bytes=4 * 1024 * 1024)


@pytest.fixture(scope="module")
def models():
    """name -> (keras model, its VariableInfo list)."""
    sys.path.insert(0, str(REPO_ROOT / "models"))
    import keras
    import registry

    from kungfu_tf.strategy.variable_info import describe_model

    out = {}
    for name in MODELS:
        keras.backend.clear_session()
        model = registry.MODELS[name].build()
        out[name] = (model, describe_model(model))
    return out


def sampled(variables, cluster, seed=0, count=COUNT, options=OPTIONS):
    return sample_strategies(variables, cluster, count, seed, options)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("cluster", CLUSTERS, ids=["np4", "np4-2hosts", "np3"])
def test_every_candidate_validates_and_is_distinct(models, name, cluster):
    _, variables = models[name]
    candidates = sampled(variables, cluster)
    assert len(candidates) == COUNT
    keys = set()
    for s in candidates:
        validate(s, variables, cluster.replicas)
        copy = type(s)()
        copy.CopyFrom(s)
        copy.id = ""
        keys.add(canonical_bytes(copy))
    assert len(keys) == len(candidates), "two candidates are the same strategy"


@pytest.mark.parametrize("name", MODELS)
def test_hand_builders_come_first(models, name):
    _, variables = models[name]
    candidates = sampled(variables, ClusterSpec(4))
    hand = [s for s in candidates if not s.id.startswith("auto-")]
    assert candidates[: len(hand)] == hand
    # Builders whose strategies coincide for this model appear once (the first of them).
    assert {s.id for s in hand} <= set(BUILDERS) and "AllReduce" in {s.id for s in hand}


def test_same_seed_same_list_other_seed_other_list(models):
    _, variables = models["bert-small"]
    cluster = ClusterSpec.uniform(4, num_hosts=2)
    a = [canonical_bytes(s) for s in sampled(variables, cluster, seed=7)]
    b = [canonical_bytes(s) for s in sampled(variables, cluster, seed=7)]
    c = [canonical_bytes(s) for s in sampled(variables, cluster, seed=8)]
    assert a == b
    assert a != c


@pytest.mark.parametrize("name", ["ncf", "bert-small"])
def test_candidates_compile_on_every_rank(models, name):
    from kungfu_tf.strategy.compiler import StrategyPlan

    model, variables = models[name]
    for i, s in enumerate(sampled(variables, ClusterSpec(3), count=12)):
        for rank in (0, 2):
            plan = StrategyPlan(s, model.trainable_variables, name=f"compile_{name}_{i}_{rank}", rank=rank, size=3)
            for _, node, target in plan.placements():
                if node.kind == "ps":  # a PS tensor is updated by its owner and nobody else
                    assert (target is not None) == (node.owner == rank), (s.id, node.name, rank)


@pytest.mark.parametrize("name", MODELS)
def test_partitioning_follows_size(models, name):
    """Constraint 1: nothing under min_partition_bytes is cut, everything over always_partition_bytes is."""
    _, variables = models[name]
    by_name = {v.name: v for v in variables}
    cut_mid = kept_mid = 0
    for s in sampled(variables, ClusterSpec(4), seed=3):
        if not s.id.startswith("auto-"):
            continue
        for node in s.node_config:
            v = by_name[node.var_name]
            cut = bool(node.part_config)
            if v.nbytes < OPTIONS.min_partition_bytes:
                assert not cut, f"{s.id}: small variable {v.name} ({v.nbytes} B) is partitioned"
            elif v.nbytes >= OPTIONS.always_partition_bytes:
                assert cut, f"{s.id}: very large variable {v.name} ({v.nbytes} B) is not partitioned"
            else:
                cut_mid += cut
                kept_mid += not cut
    mid = [v for v in variables if OPTIONS.min_partition_bytes <= v.nbytes < OPTIONS.always_partition_bytes]
    if mid:
        assert cut_mid and kept_mid, "variables between the thresholds should be cut in some samples only"


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("cluster", CLUSTERS, ids=["np4", "np4-2hosts", "np3"])
def test_owner_loads_balance(models, name, cluster):
    """Constraint 2: no owner holds more than an even share of the PS bytes plus one tensor."""
    _, variables = models[name]
    checked = 0
    for s in sampled(variables, cluster, seed=5):
        if not s.id.startswith("auto-"):
            continue
        loads = [0] * cluster.replicas
        biggest = 0
        for node in effective_nodes(s, variables, cluster.replicas):
            if node.kind == "ps":
                loads[node.owner] += node.nbytes
                biggest = max(biggest, node.nbytes)
        if sum(loads):
            assert max(loads) <= sum(loads) / cluster.replicas + biggest, f"{s.id}: owner loads {loads}"
            checked += 1
    assert checked > 0, "no sampled strategy used a parameter server"


@pytest.mark.parametrize("name", MODELS)
def test_merge_groups_balance(models, name):
    """Constraint 3: every all-reduce group holds at most an even share plus its largest tensor."""
    _, variables = models[name]
    checked = 0
    for s in sampled(variables, ClusterSpec(4), seed=11):
        if not s.id.startswith("auto-"):
            continue
        groups: dict[int, list[int]] = defaultdict(list)
        for node in effective_nodes(s, variables, 4):
            if node.kind == "all_reduce":
                groups[node.group].append(node.nbytes)
        if len(groups) < 2:
            continue
        total = sum(sum(g) for g in groups.values())
        for g, sizes in groups.items():
            assert sum(sizes) <= total / len(groups) + max(sizes), f"{s.id}: group {g} {sum(sizes)} of {total}"
        checked += 1
    assert checked > 0, "no sampled strategy had two merge groups"


def test_styles_span_all_reduce_ps_and_hybrids(models):
    _, variables = models["bert-small"]
    kinds = set()
    for s in sampled(variables, ClusterSpec(4), seed=2, count=40):
        if s.id.startswith("auto-"):
            kinds.add(frozenset(n.kind for n in effective_nodes(s, variables, 4)))
    assert {frozenset({"all_reduce"}), frozenset({"ps"}), frozenset({"all_reduce", "ps"})} <= kinds


def test_balanced_groups_are_contiguous_and_even():
    assert balanced_groups([1] * 8, 4) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert balanced_groups([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2) == [0] + [1] * 10
    assert balanced_groups([5], 3) == [0]


def test_compressors_only_on_floating_variables():
    vs = [VariableInfo("w", (600, 600)), VariableInfo("steps", (600, 600), dtype="int64")]
    opts = SamplerOptions(compressors=("fp16",), include_builders=False)
    for s in sample_strategies(vs, ClusterSpec(2), 10, 0, opts):
        for node in effective_nodes(s, vs, 2):
            if node.kind == "all_reduce":
                assert node.compressor == ("fp16" if node.var_name == "w" else "none")


def test_a_tiny_model_gives_fewer_candidates_than_asked():
    """A 12-byte variable has few distinct strategies: the sampler returns each once and stops, never pads."""
    vs, cluster = [VariableInfo("b", (3,))], ClusterSpec(2)
    out = sample_strategies(vs, cluster, 50, 0)
    assert 1 <= len(out) < 50
    assert len({canonical_bytes(s) for s in out}) == len(out), "a candidate came twice"
    # The space is exhausted: asking for ten times more gives the very same candidates.
    more = sample_strategies(vs, cluster, 500, 0)
    assert [canonical_bytes(s) for s in more] == [canonical_bytes(s) for s in out]


@pytest.mark.parametrize(
    "variables,count,message",
    [
        ([VariableInfo("w", (2,))], 0, "count must be >= 1 candidate, got 0"),
        ([], 5, "the model has no trainable variables"),
        ([VariableInfo("w", (2,)), VariableInfo("w", (3,))], 5, "two trainable variables are both named 'w'"),
    ],
)
def test_bad_input_is_a_precise_error(variables, count, message):
    with pytest.raises(StrategyError, match=message):
        sample_strategies(variables, ClusterSpec(2), count, seed=0)


def test_bad_options_are_precise_errors():
    with pytest.raises(StrategyError, match="unknown topology 'TORUS'"):
        SamplerOptions(topologies=("TORUS",))
    with pytest.raises(StrategyError, match="max_groups must be >= 1"):
        SamplerOptions(max_groups=0)
