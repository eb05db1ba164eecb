"""A parameter server's new value and its optimizer slots' replicas travel in one broadcast per unit.

In an elastic job every rank keeps replicas of each synchronous parameter
server's slots (``StrategyPlan.keep_slot_replicas``), so that a SIGKILLed
owner's survive. The owner once published them in broadcasts of their own
after the value's: 1 + kinds messages per unit and step (make
bench-slot-replicas: 4-23 % of 1.5-7 ms steps), and an owner lost between
them left a value one step ahead of its slots. Traced here for rank 1 of 2
(the graph only: one process cannot run a two-worker step), and
``publish_together`` run on one worker against the tensors it packs.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from conftest import checked_counts, describe, run_job

from kungfu_tf.strategy import format as strategy_format
from kungfu_tf.strategy.compiler import StrategyPlan
from kungfu_tf.strategy.kernels.ps_sync import publish_together

STRATEGY = """
id: "hand"
node_config { var_name: "a" ps { owner: 0 } }
node_config { var_name: "c" partitioner: "2,1"
  part_config { var_name: "c/part_0" ps { owner: 0 } }
  part_config { var_name: "c/part_1" ps { owner: 1 } } }
node_config { var_name: "d" all_reduce { } }
"""
KINDS = 2  # Adam: two slots per variable


def broadcast_sizes(graph: tf.Graph) -> list[int]:
    """The number of elements each of the graph's broadcasts sends."""
    return sorted(op.outputs[0].shape.num_elements() for op in graph.get_operations() if op.type == "KungfuBroadcast")


def test_each_units_value_and_slot_replicas_are_one_broadcast():
    variables = [tf.Variable(tf.ones([3]), name="a"), tf.Variable(tf.ones([4, 2]), name="c"),
                 tf.Variable(tf.ones([2]), name="d")]  # fmt: skip
    plan = StrategyPlan(strategy_format.parse(STRATEGY), variables, name="slot_publish", rank=1, size=2)
    units = plan.replicable_units()
    assert len(units) == 3  # a, c/part_0 (rank 0's), c/part_1 (this rank's)
    slots_of = {id(t): [tf.Variable(tf.zeros(t.shape)) for _ in range(KINDS)] for t in plan.targets}
    plan.keep_slot_replicas(slots_of, KINDS, lambda vi, node: [np.zeros(node.shape, np.float32)] * KINDS)
    assert len(plan.slot_replicas) == 2 and all(len(r) == KINDS for r in plan.slot_replicas.values())

    def apply_fn(grads, targets):
        return [t.assign_sub(g) for g, t in zip(grads, targets)]

    @tf.function
    def step():
        plan.step([tf.ones_like(v) for v in variables], apply_fn)

    sent = broadcast_sizes(step.get_concrete_function().graph)
    # One per parameter-server unit, its value and KINDS slots together (before, 1 + KINDS per unit):
    # a (3 elements), c's two shards (2 x 2 each).
    assert sent == [(1 + KINDS) * 3, (1 + KINDS) * 4, (1 + KINDS) * 4], sent


def test_publish_together_returns_each_tensor_as_it_was():
    rng = np.random.default_rng(0)
    tensors = [rng.standard_normal(s).astype(np.float32) for s in ([3], [2, 4], [1, 1, 5], [])]
    got = publish_together([tf.constant(t) for t in tensors], owner=0, name="together_test")  # one worker
    for g, t in zip(got, tensors):
        assert g.shape == t.shape
        np.testing.assert_array_equal(g.numpy(), t)


def test_a_fresh_optimizers_replicas_start_as_its_owners_slots():
    # tests/workers/slot_replica_start.py: Adagrad's and Ftrl's accumulators start at their initial value on the
    # owner, and so must the other worker's replicas (they started at zeros).
    rc, out, err = run_job(2, "slot_replica_start.py", timeout=120, extra_launcher_args=["--elastic", "--max-np", "2"])
    assert rc == 0, describe(rc, out, err)
    assert checked_counts(out) == {0: 7, 1: 7}, describe(rc, out, err)


def test_optimizers_whose_slots_cannot_move_are_refused_on_every_worker():
    # tests/workers/slot_refusal.py: Adafactor (slots not of the variables' shapes) under PS, and Muon (one slot for
    # matrices, two for the rest: each rank alone looks consistent) under PSLoadBalancing. Before, one rank raised
    # and the other waited for it.
    rc, out, err = run_job(2, "slot_refusal.py", timeout=120, extra_launcher_args=["--elastic", "--max-np", "2"])
    assert rc == 0, describe(rc, out, err)
    assert checked_counts(out) == {0: 6, 1: 6}, describe(rc, out, err)
