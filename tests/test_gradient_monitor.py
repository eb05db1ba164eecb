"""GradientMonitor (kungfu_tf/optimizers/gradient_monitor.py) and its kernels (kungfu_tf.ops.monitor).

Multi-worker (tests/workers/gradient_monitor.py, np in {1, 2, 4}): on linear
regression with a closed-form gradient mean and covariance, the monitored
values equal a numpy replay of the estimator on every worker's data, the
smoothed GNS is within 25 % of the true value (>= 4 standard deviations of
the estimator there), the gradient variance equals numpy's, a worker slowed
inside its step shows in worker_compute_times (and the others' wait does
not), the monitor's state survives a checkpoint; Keras fit, tf.function, a
strategy and v1 MonitoredTrainingSession each run.

In-process (a one-worker cluster): the kernels against numpy, the rider
riding inside the existing gradient collectives (graph inspection), and the
errors for bad use.
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_job_ok, rank_lines, run_job

with contextlib.suppress(RuntimeError):  # already set if another test ran TF first
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

import keras

from kungfu_tf.ops import monitor as monitor_ops
from kungfu_tf.optimizers import (
    GradientMonitor,
    MonitorGradientNoiseScaleOptimizer,
    SynchronousSGDOptimizer,
)


def expected_checks(np_: int) -> int:
    # Keep in step with tests/workers/gradient_monitor.py.
    replayed = 5  # gns, gns_raw, noise_trace, grad_sq_norm, grad_variance
    compared = 10 + 5 + 1  # steps compared in check_function: t < 10, every 50th, the last
    function = compared * (replayed + 2) + 2  # + gns_raw read inside the step, monitor_step
    checkpoint_vars = 12  # local_batch_size, 8 tensors, 3 of EMA state
    checkpoint = 1 + checkpoint_vars + 1 + replayed
    keras_part = replayed + 1
    v1 = 1 + replayed
    strategy = replayed
    clock = 3 * (3 + (np_ - 1))
    return function + checkpoint + keras_part + v1 + strategy + clock


@pytest.mark.parametrize("np_", [1, 2, 4])
def test_monitor_against_closed_form_and_numpy(np_, tmp_path):
    rc, out, err = run_job(np_, "gradient_monitor.py", np_, tmp_path, timeout=240)
    assert_job_ok(rc, out, err, np_, expected_checks(np_))
    lines = rank_lines(out)[0]
    assert any(re.match(rf"np={np_}: GNS [\d.]+ \(true 6.0\)", line) for line in lines), lines


# ----------------------------------------------------------------- kernels


def test_squared_norm_and_squares_match_numpy():
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((3, 4)), rng.standard_normal(5), rng.standard_normal((2, 2))]
    dtypes = [tf.float32, tf.float64, tf.float16]
    tensors = [tf.constant(a, d) for a, d in zip(arrays, dtypes)]
    want = sum(float(np.sum(t.numpy().astype(np.float64) ** 2)) for t in tensors)
    assert float(monitor_ops.squared_norm(tensors)) == pytest.approx(want, rel=1e-12)
    assert float(monitor_ops.squared_norm([])) == 0.0
    squared = monitor_ops.squares(tensors)
    for t, s in zip(tensors, squared):
        assert s.dtype == t.dtype and s.shape == t.shape
        np.testing.assert_allclose(s.numpy(), t.numpy() ** 2, rtol=1e-3)


def test_pair_norms_and_mean_variance_match_numpy():
    rng = np.random.default_rng(2)
    a = [rng.standard_normal((4, 3)), rng.standard_normal(7)]
    b = [rng.standard_normal((4, 3)), rng.standard_normal(7)]
    got = monitor_ops.pair_squared_norms([tf.constant(x) for x in a], [tf.constant(x) for x in b]).numpy()
    flat_a, flat_b = np.concatenate([x.ravel() for x in a]), np.concatenate([x.ravel() for x in b])
    want = [flat_a @ flat_a, flat_b @ flat_b, (0.5 * (flat_a + flat_b)) @ (0.5 * (flat_a + flat_b))]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    workers = rng.standard_normal((3, 10))  # 3 workers' gradients
    variance = monitor_ops.mean_variance([tf.constant(np.mean(workers**2, 0))], [tf.constant(np.mean(workers, 0))])
    assert float(variance) == pytest.approx(float(np.mean(np.var(workers, axis=0))), rel=1e-12)
    assert np.isnan(float(monitor_ops.mean_variance([], [])))


def test_gns_estimates_are_unbiased_formulas():
    # E|g_B|^2 = |G|^2 + tr / B with |G|^2 = 2, tr = 12: B=4 -> 5, B=12 -> 3.
    grad_sq, trace = monitor_ops.gns_estimates(tf.constant(5.0, tf.float64), tf.constant(3.0, tf.float64), 4, 12)
    assert float(grad_sq) == pytest.approx(2.0) and float(trace) == pytest.approx(12.0)


def test_kernels_reject_unpaired_lists():
    with pytest.raises(ValueError, match="current has 1 tensors, previous 2"):
        monitor_ops.pair_squared_norms([tf.ones([2])], [tf.ones([2]), tf.ones([2])])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"tensor 0 has shape \[2\] in the first list and \[3\]"):
        monitor_ops.mean_variance([tf.ones([2])], [tf.ones([3])])
    with pytest.raises(TypeError, match="squared_norm: tensor 0 must be float16, bfloat16, float32 or float64, got int32"):
        monitor_ops.squared_norm([tf.ones([2], tf.int32)])


# ---------------------------------------------------------- in the dataflow


def _collectives(graph: tf.Graph) -> list[str]:
    ops_ = [op for op in graph.get_operations()]
    for f in graph._functions.values():  # cond branches
        ops_ += f.graph.get_operations() if hasattr(f, "graph") else []
    return sorted(op.type for op in ops_ if op.type.startswith("Kungfu") and "AllReduce" in op.type)


def _traced_step(monitor: GradientMonitor | None, fusion: int) -> tf.Graph:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), fusion_threshold_bytes=fusion, monitor=monitor)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return step.get_concrete_function(tf.TensorSpec([2, 3])).graph


@pytest.mark.parametrize("fusion", [0, 1 << 20])
def test_gns_rides_inside_the_gradient_all_reduce(fusion):
    """GNS and compute times add no collective: same all-reduces with and without the monitor."""
    plain = _collectives(_traced_step(None, fusion))
    monitored = _collectives(_traced_step(GradientMonitor(batch_size=2), fusion))
    assert len(plain) == len(monitored), (plain, monitored)
    if fusion == 0:
        # One all-reduce per gradient; the rider turns one of them into a group of two.
        assert plain == ["KungfuAllReduce"] * 4
        assert monitored == ["KungfuAllReduce"] * 3 + ["KungfuGroupAllReduce"]
    else:
        assert plain == monitored == ["KungfuGroupAllReduce"]


def test_variance_adds_one_collective_inside_a_cond():
    graph = _traced_step(GradientMonitor(batch_size=2, variance_interval=4), 1 << 20)
    assert "If" in {op.type for op in graph.get_operations()} or "StatelessIf" in {
        op.type for op in graph.get_operations()
    }
    assert len(_collectives(graph)) == len(_collectives(_traced_step(None, 1 << 20))) + 1


def test_one_worker_without_tf_function_and_values():
    """Eagerly (one worker): pairing with the previous gradient starts at the second step."""
    monitor = GradientMonitor(batch_size=1, smoothing=0.0)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor)
    w = keras.Variable([1.0, 2.0])
    opt.apply_gradients([(tf.constant([1.0, 0.0]), w)])
    assert np.isnan(monitor.values()["gns"]) and monitor.values()["monitor_step"] == 1
    opt.apply_gradients([(tf.constant([0.0, 1.0]), w)])
    # small = (1 + 1) / 2 = 1 (B=1), big = |(0.5, 0.5)|^2 = 0.5 (B=2): |G|^2 = 0, tr = 1.
    values = monitor.values()
    assert values["grad_sq_norm"] == pytest.approx(0.0) and values["noise_trace"] == pytest.approx(1.0)
    assert isinstance(values["worker_compute_times"], list) and values["monitor_step"] == 2


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"batch_size": 0}, ValueError, "batch_size must be > 0, got 0"),
        ({"batch_size": -3}, ValueError, "batch_size must be > 0, got -3"),
        ({"batch_size": 2.5}, TypeError, "batch_size must be an int > 0, got 2.5"),
        ({"batch_size": True}, TypeError, "batch_size must be an int > 0, got True"),
        ({"batch_size": 8, "smoothing": 1.0}, ValueError, r"smoothing must be a number in \[0, 1\), got 1.0"),
        ({"batch_size": 8, "smoothing": -0.1}, ValueError, r"smoothing must be a number in \[0, 1\), got -0.1"),
        ({"batch_size": 8, "variance_interval": -1}, ValueError, "variance_interval must be >= 0"),
        ({"batch_size": 8, "gns": "yes"}, TypeError, "gns must be a bool, got 'yes'"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        GradientMonitor(**kwargs)


def test_bad_use():
    with pytest.raises(TypeError, match="monitor must be a kungfu_tf.optimizers.GradientMonitor or None, got builtins.str"):
        SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), monitor="gns")
    monitor = GradientMonitor(batch_size=4)
    SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), monitor=monitor)
    with pytest.raises(ValueError, match="already attached to another optimizer"):
        SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), monitor=monitor)
    with pytest.raises(ValueError, match="batch_size must be > 0, got 0"):
        MonitorGradientNoiseScaleOptimizer(keras.optimizers.SGD(0.1), device_batch_size=0)
    assert SynchronousSGDOptimizer(keras.optimizers.SGD(0.1)).kungfu_monitor is None


def test_parameter_server_strategy_is_refused_with_the_variables_named():
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="PS", monitor=GradientMonitor(batch_size=4))
    with pytest.raises(ValueError, match=r"updates \['ps_w'\] on parameter servers"):
        opt.build([keras.Variable([1.0, 2.0], name="ps_w")])


def test_v1_monitor_created_eagerly_is_refused_in_a_graph():
    monitor = GradientMonitor(batch_size=4)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=[1.0])
        opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), monitor=monitor)
        with pytest.raises(ValueError, match="created eagerly but the training step is a tf.compat.v1 graph"):
            opt.minimize(tf.reduce_sum(w * w))


def test_v1_values_need_a_session():
    with tf.Graph().as_default():
        monitor = GradientMonitor(batch_size=4)
        with pytest.raises(RuntimeError, match=r"pass the session: values\(session=...\)"):
            monitor.values()
