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
    plan.keep_slot_replicas(slots_of, lambda vi, node: [(tuple(node.shape), "float32")] * KINDS,
                            lambda vi, node: [np.zeros(node.shape, np.float32)] * KINDS)  # fmt: skip
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


FACTORED = """
id: "factored"
node_config { var_name: "m" ps { owner: 0 } }
node_config { var_name: "b" ps { owner: 0 } }
node_config { var_name: "n" ps { owner: 0 } }
"""


def test_slots_not_of_their_variables_shape_travel_with_the_value():
    # Adafactor: a matrix's slots are its row and column sums and a velocity; a bias's are two int32 placeholder
    # scalars and a velocity. Muon: a matrix has one slot kind fewer (None). Rank 1 keeps replicas of each, of
    # the owner's shapes and dtypes; the float32 ones go with the value, the int32 ones in one broadcast more.
    variables = [tf.Variable(tf.ones([4, 2]), name="m"), tf.Variable(tf.ones([3]), name="b"),
                 tf.Variable(tf.ones([5, 2]), name="n")]  # fmt: skip
    layouts = [[((4,), "float32"), ((2,), "float32"), ((4, 2), "float32")],
               [((), "int32"), ((), "int32"), ((3,), "float32")],
               [((5, 2), "float32"), None, None]]  # fmt: skip
    plan = StrategyPlan(strategy_format.parse(FACTORED), variables, name="factored_publish", rank=1, size=2)
    plan.keep_slot_replicas({}, lambda vi, node: layouts[vi],
                            lambda vi, node: [None if s is None else np.zeros(s[0], s[1]) for s in layouts[vi]])  # fmt: skip
    for (vi, _), replicas in plan.slot_replicas.items():
        got = [None if r is None else (tuple(r.shape), r.dtype.name) for r in replicas]
        assert got == layouts[vi], (vi, got)

    def apply_fn(grads, targets):
        return [t.assign_sub(g) for g, t in zip(grads, targets)]

    @tf.function
    def step():
        plan.step([tf.ones_like(v) for v in variables], apply_fn)

    sent = broadcast_sizes(step.get_concrete_function().graph)
    assert sent == sorted([8 + 4 + 2 + 8, 3 + 3, 2, 10 + 10]), sent


def test_publish_together_sends_each_dtype_once():
    tensors = [tf.constant([1.5, 2.5]), tf.constant(7, tf.int32), tf.constant([[3.0]]), tf.constant([8, 9], tf.int32)]
    got = publish_together(tensors, owner=0, name="together_dtypes")  # one worker
    for g, t in zip(got, tensors):
        assert g.dtype == t.dtype and g.shape == t.shape
        np.testing.assert_array_equal(g.numpy(), t.numpy())


def test_a_fresh_optimizers_replicas_start_as_its_owners_slots():
    # tests/workers/slot_replica_start.py: Adagrad's and Ftrl's accumulators start at their initial value on the
    # owner, and so must the other worker's replicas (they started at zeros).
    rc, out, err = run_job(2, "slot_replica_start.py", timeout=120, extra_launcher_args=["--elastic", "--max-np", "2"])
    assert rc == 0, describe(rc, out, err)
    assert checked_counts(out) == {0: 7, 1: 7}, describe(rc, out, err)


def test_slots_that_cannot_be_cut_into_shards_are_refused_on_every_worker():
    # tests/workers/slot_refusal.py: Adafactor (a matrix's factored slots are not of its shape) under PartitionedPS.
    # The rank whose shard's slots were checked raised, the other waited for it.
    rc, out, err = run_job(2, "slot_refusal.py", timeout=120, extra_launcher_args=["--elastic", "--max-np", "2"])
    assert rc == 0, describe(rc, out, err)
    assert checked_counts(out) == {0: 3, 1: 3}, describe(rc, out, err)
