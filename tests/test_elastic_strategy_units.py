"""Units of a strategy's re-build at a membership change: owner re-mapping, plan generations, re-tracing.

The multi-worker behaviour is in tests/test_elastic_strategy.py; these check the pieces against
what they must compute, in one process.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from kungfu_tf.elastic import function
from kungfu_tf.strategy import format as strategy_format
from kungfu_tf.strategy import plan_generation
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.remap import remap_owners

STRATEGY = """
id: "hand"
node_config { var_name: "a" ps { owner: 0 } }
node_config { var_name: "b" ps { owner: 2 } }
node_config { var_name: "c" partitioner: "2,1"
  part_config { var_name: "c/part_0" ps { owner: 1 } }
  part_config { var_name: "c/part_1" ps { owner: 3 } } }
node_config { var_name: "d" all_reduce { } }
"""


def owners(strategy) -> dict[str, int]:
    out = {}
    for node in strategy.node_config:
        for n in [node, *node.part_config]:
            if n.WhichOneof("synchronizer") == "ps":
                out[n.var_name] = n.ps.owner
    return out


def test_owners_follow_their_peer_and_those_that_left_go_to_old_rank_mod_size():
    s = strategy_format.parse(STRATEGY)
    got = remap_owners(s, ("p0", "p1", "p2", "p3"), ("p2", "p0", "p9"))
    # p0 -> rank 1, p2 -> rank 0; p1 (old 1) and p3 (old 3) left: 1 % 3 = 1, 3 % 3 = 0.
    assert owners(got) == {"a": 1, "b": 0, "c/part_0": 1, "c/part_1": 0}
    assert owners(s) == {"a": 0, "b": 2, "c/part_0": 1, "c/part_1": 3}  # the original is unchanged
    assert got.node_config[3].WhichOneof("synchronizer") == "all_reduce"


def test_a_strategy_for_a_fixed_number_of_replicas_is_refused_at_another_size():
    s = strategy_format.parse(STRATEGY + "graph_config { replicas: 4 }")
    with pytest.raises(StrategyError, match=r"written for 4 replicas .* changed to 3 workers"):
        remap_owners(s, ("p0", "p1", "p2", "p3"), ("p0", "p1", "p2"))
    assert owners(remap_owners(s, ("p0", "p1", "p2", "p3"), ("p3", "p2", "p1", "p0")))["b"] == 1  # same size


def test_a_graph_traced_before_a_rebuild_refuses_to_run_after_it():
    v = tf.Variable(0.0)

    @tf.function
    def step():
        with tf.control_dependencies([plan_generation.check_current("'hand'")]):
            return v.assign_add(1.0)

    step()
    plan_generation.advance()
    with pytest.raises(tf.errors.InvalidArgumentError, match="traced for the strategy as it was before a membership"):
        step()
    assert float(v.numpy()) == 1.0  # nothing ran


def test_elastic_function_traces_again_once_per_generation():
    v = tf.Variable(0.0)

    @function
    def step(x):
        with tf.control_dependencies([plan_generation.check_current("'hand'")]):
            return v.assign_add(x)

    for _ in range(3):
        step(tf.constant(1.0))
    assert step.traces == 1
    plan_generation.advance()
    for _ in range(3):
        step(tf.constant(1.0))
    assert step.traces == 2 and float(v.numpy()) == 6.0


def test_elastic_function_refuses_what_it_cannot_trace_again():
    with pytest.raises(TypeError, match="decorates a Python function, got int"):
        function(42)
    with pytest.raises(TypeError, match="not a tf.function"):
        function(tf.function(lambda x: x))
    with pytest.raises(TypeError, match="no_such_option"):
        function(lambda x: x, no_such_option=True)
