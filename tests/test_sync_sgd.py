"""SynchronousSGDOptimizer (kungfu_tf/optimizers): S-SGD equals one process on the union.

Multi-worker (tests/workers/sync_sgd_equivalence.py, one launch per N in
{2, 4}): every worker trains on its own disjoint B-row shard of each global
batch from identical initial weights, with SGD + momentum wrapped in
SynchronousSGDOptimizer, for 6 steps. Rank 0 also trains a plain optimizer in
the same process on the whole N*B-row global batches and requires equal
weights *and* optimizer variables (momentum slots, iterations) within
rtol 1e-5, atol 1e-6 (float32); a consensus requires every other worker to
hold exactly rank 0's state. Covered APIs: Keras Model.fit (with a
learning-rate schedule), a tf.function loop calling apply_gradients (several
fusion buckets), tf.compat.v1 graph + MonitoredTrainingSession with a v1
MomentumOptimizer (no fusion), and an Embedding model whose gradient is
tf.IndexedSlices with sparse_as_dense False and True. The worker also checks
average_gradients directly on slices whose count differs per rank.

In-process (no launcher, a one-worker cluster): wrapping errors, the Keras
subclass keeping class, config and state, and how fusion_threshold_bytes and
sparse_as_dense map gradients onto collectives (graph inspection).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_job_ok, rank_lines, run_job

with contextlib.suppress(RuntimeError):  # already set if another test ran TF first
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

import keras

from kungfu_tf.optimizers import SynchronousSGDOptimizer, average_gradients

# Keep in step with tests/workers/sync_sgd_equivalence.py.
DIRECT = 3 * 8  # average_gradients: 3 thresholds x 8 checks
# Per part: consensus (all ranks) + arrays compared with the reference (rank 0).
PARTS = {  # part: (checks on every rank besides consensus, arrays compared on rank 0)
    "keras": (1, 4 + 5),  # iterations; 4 weights + iterations + 4 momentums (lr is a schedule)
    "function": (0, 4 + 6),  # 4 weights + iterations, learning_rate, 4 momentums
    "v1": (1, 4 + 4),  # global step; 4 weights + 4 momentum slots
    "sparse": (1, 3 + 5),  # IndexedSlices seen; 3 weights + iterations, lr, 3 momentums
    "sparse_as_dense": (1, 3 + 5),
}


def expected_checks(rank: int) -> int:
    return DIRECT + sum(1 + other + (arrays if rank == 0 else 0) for other, arrays in PARTS.values())


@pytest.mark.parametrize("np_", [2, 4])
def test_equivalence_with_one_process(np_):
    rc, out, err = run_job(np_, "sync_sgd_equivalence.py", np_, timeout=180)
    counts = assert_job_ok(rc, out, err, np_)
    assert counts == {r: expected_checks(r) for r in range(np_)}, out[-4000:]
    assert "MISMATCH" not in err


def test_wrapping_twice_raises_value_error():
    keras_opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1))
    v1_opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    for wrapped in (keras_opt, v1_opt):
        with pytest.raises(ValueError, match="already"):
            SynchronousSGDOptimizer(wrapped)


@pytest.mark.parametrize("not_an_optimizer", ["sgd", tf.Module(), None, keras.layers.Dense(1)])
def test_non_optimizer_raises_type_error(not_an_optimizer):
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer"):
        SynchronousSGDOptimizer(not_an_optimizer)


def test_negative_fusion_threshold_raises_value_error():
    with pytest.raises(ValueError, match="fusion_threshold_bytes"):
        SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), fusion_threshold_bytes=-1)


def test_keras_wrapper_keeps_class_config_schedule_and_state():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=2, decay_rate=0.5)
    opt = keras.optimizers.SGD(schedule, momentum=0.9)
    var = keras.Variable(np.ones(3, np.float32))
    opt.apply_gradients([(tf.ones(3), var)])  # built, with a non-zero momentum slot
    wrapped = SynchronousSGDOptimizer(opt)
    assert isinstance(wrapped, keras.optimizers.SGD) and type(wrapped) is not keras.optimizers.SGD
    assert type(wrapped).__name__ == "SGD"
    assert wrapped.get_config() == opt.get_config()
    assert int(wrapped.iterations.numpy()) == 1
    for mine, theirs in zip(wrapped.variables, opt.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    # One worker: averaging changes nothing. The second step must use the copied
    # momentum (-0.1) and the schedule at iteration 1 (0.1 * 0.5 ** 0.5).
    wrapped.apply_gradients([(tf.ones(3), var)])
    momentum = 0.9 * -0.1 - 0.1 * 0.5**0.5
    np.testing.assert_allclose(var.numpy(), np.full(3, 0.9 + momentum), rtol=1e-6)
    assert int(wrapped.iterations.numpy()) == 2


def _collective_ops(fn) -> dict[str, int]:
    """Op type -> count of the kungfu collectives that ``fn`` adds to a fresh graph."""
    with tf.Graph().as_default() as g:
        fn()
    counts: dict[str, int] = {}
    for op in g.get_operations():
        if op.type in ("KungfuAllReduce", "KungfuGroupAllReduce", "KungfuAllGather"):
            counts[op.type] = counts.get(op.type, 0) + 1
    return counts


def _grads():
    # 40 + 40 + 120 bytes of float32, a None, and IndexedSlices.
    sparse = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([0, 4]), tf.constant([5, 3]))
    return [tf.ones([10]), tf.ones([10]), None, tf.ones([30]), sparse]


@pytest.mark.parametrize(
    ("threshold", "sparse_as_dense", "expected"),
    [
        (64 << 20, False, {"KungfuGroupAllReduce": 1, "KungfuAllGather": 3}),  # one bucket; count/indices/values
        # [10, 10] fused; the oversized [30] alone, in place (no fused copy)
        (80, False, {"KungfuGroupAllReduce": 1, "KungfuAllReduce": 1, "KungfuAllGather": 3}),
        (0, False, {"KungfuAllReduce": 3, "KungfuAllGather": 3}),  # no fusion
        (0, True, {"KungfuAllReduce": 4}),  # the slices too, densified
        (64 << 20, True, {"KungfuGroupAllReduce": 1}),
    ],
)
def test_fusion_and_sparse_map_onto_collectives(threshold, sparse_as_dense, expected):
    def build():
        out = average_gradients(_grads(), fusion_threshold_bytes=threshold, sparse_as_dense=sparse_as_dense)
        assert out[2] is None
        assert isinstance(out[4], tf.IndexedSlices) != sparse_as_dense
        # A second call in the same graph gets its own message keys (no ValueError).
        average_gradients(_grads(), fusion_threshold_bytes=threshold, sparse_as_dense=sparse_as_dense)

    assert _collective_ops(build) == {k: 2 * n for k, n in expected.items()}


def test_a_loss_scale_optimizer_is_refused_with_parameter_servers():
    # Each owner would skip steps and grow its loss scale from its own variables' gradients alone: the workers'
    # scales drift apart (a rank that owns nothing never grows its scale) and the averages mix them. Before, it
    # trained; in an elastic job it was refused with "has 2 slot variables but updates no variable here".
    from kungfu_tf.strategy.errors import StrategyError

    w = keras.Variable([1.0, 2.0], name="lso_w")
    opt = SynchronousSGDOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), strategy="PS")
    for _ in range(2):  # and again: nothing was built by the first try
        with pytest.raises(StrategyError, match=r"updates \['lso_w'\] on parameter servers: each owner would skip"):
            opt.apply([tf.constant([1.0, 1.0])], [w])
    np.testing.assert_array_equal(w.numpy(), [1.0, 2.0])
    # Under all-reduce it steps as Keras's own LossScaleOptimizer does (one worker).
    ours = SynchronousSGDOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), strategy="AllReduce")
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    a, b = keras.Variable([1.0, 2.0], name="lso_a"), keras.Variable([1.0, 2.0], name="lso_b")
    ours.build([a])
    theirs.build([b])
    for g in ([1.0, 1.0], [np.inf, 1.0], [0.5, -1.0]):
        ours.apply([tf.constant(g) * ours.dynamic_scale], [a])
        theirs.apply([tf.constant(g) * theirs.dynamic_scale], [b])
    np.testing.assert_allclose(a.numpy(), b.numpy())
    assert float(ours.dynamic_scale) == float(theirs.dynamic_scale) < 32768.0  # the inf halved both
    # Nor may a switch put it under parameter servers (switch_strategy, and builders.Auto's trials, which
    # start from AllReduce): refused before anything moves, and the step goes on under all-reduce.
    with pytest.raises(StrategyError, match=r"updates \['lso_a'\] on parameter servers: each owner would skip"):
        ours.kungfu_switch_strategy("PS")
    assert ours._kungfu_plan.replicated
    ours.apply([tf.constant([1.0, 1.0]) * ours.dynamic_scale], [a])
    theirs.apply([tf.constant([1.0, 1.0]) * theirs.dynamic_scale], [b])
    np.testing.assert_allclose(a.numpy(), b.numpy())


def test_fit_under_mixed_float16_with_one_worker_overflowing():
    # tests/workers/loss_scale_fit.py: compile() wraps SynchronousSGDOptimizer in a LossScaleOptimizer, which
    # stepped (and entered the all-reduce) only where the worker's own gradients were finite: the job hung with
    # the workers' averages paired across steps. Now refused on every worker; the other way round
    # (SynchronousSGDOptimizer(LossScaleOptimizer(opt))) both workers skip and apply alike.
    rc, out, err = run_job(2, "loss_scale_fit.py", timeout=120)
    assert_job_ok(rc, out, err, np=2, expected_checks=6)
    lines = {rank: [line for line in got if line.startswith("weights ")] for rank, got in rank_lines(out).items()}
    assert len(lines[0]) == 1 and lines[0] == lines[1], lines  # the same weights and scale on both workers
