"""GradientMonitor (kungfu_tf/optimizers/gradient_monitor.py) and its kernels (kungfu_tf.ops.monitor).

tests/workers/gradient_monitor.py (np 2 and 4 launched, np 1 in this process): on linear
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
import importlib
import re
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import WORKERS_DIR, assert_job_ok, rank_lines, run_job

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
    checkpoint = 1 + checkpoint_vars + 1 + replayed + checkpoint_vars + replayed  # same object, then fresh ones
    keras_part = replayed + 1
    v1 = 1 + replayed
    strategy = replayed
    clock = 3 * (3 + (np_ - 1))
    return function + checkpoint + keras_part + v1 + strategy + clock


@pytest.mark.parametrize("np_", [2, 4])
def test_monitor_against_closed_form_and_numpy(np_, tmp_path):
    rc, out, err = run_job(np_, "gradient_monitor.py", np_, tmp_path, timeout=240)
    assert_job_ok(rc, out, err, np_, expected_checks(np_))
    lines = rank_lines(out)[0]
    assert any(re.match(rf"np={np_}: GNS [\d.]+ \(true 6.0\)", line) for line in lines), lines


def test_monitor_against_closed_form_and_numpy_one_worker_in_process(tmp_path, capsys, monkeypatch):
    """The same worker with np=1, run in this process (a cluster of one): every check, no job launch."""
    monkeypatch.syspath_prepend(str(WORKERS_DIR))
    monkeypatch.setattr(sys, "argv", ["gradient_monitor.py", "1", str(tmp_path)])
    worker = importlib.import_module("gradient_monitor")
    worker.main()
    out = capsys.readouterr().out.splitlines()
    assert f"checked {expected_checks(1)} results" in out, out
    assert any(re.match(r"np=1: GNS [\d.]+ \(true 6.0\)", line) for line in out), out


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


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_pair_norms_and_mean_variance_in_every_dtype(dtype):
    """Each dtype's own loop (Eigen for float32/float64), against numpy on the values as stored."""
    rng = np.random.default_rng(3)
    a = [tf.constant(rng.standard_normal(s), dtype) for s in ((5, 3), (17,))]
    b = [tf.constant(rng.standard_normal(s), dtype) for s in ((5, 3), (17,))]
    flat_a = np.concatenate([tf.cast(x, tf.float64).numpy().ravel() for x in a])
    flat_b = np.concatenate([tf.cast(x, tf.float64).numpy().ravel() for x in b])
    mean = 0.5 * (flat_a + flat_b)
    got = monitor_ops.pair_squared_norms(a, b).numpy()
    np.testing.assert_allclose(got, [flat_a @ flat_a, flat_b @ flat_b, mean @ mean], rtol=1e-12)
    squares = [tf.abs(x) + tf.square(y) for x, y in zip(a, b)]  # >= means^2 somewhere, < elsewhere
    flat_sq = np.concatenate([tf.cast(x, tf.float64).numpy().ravel() for x in squares])
    want = float(np.mean(np.maximum(flat_sq - flat_b**2, 0.0)))
    assert float(monitor_ops.mean_variance(squares, b)) == pytest.approx(want, rel=1e-12)


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
    # A non-finite gradient (and the next step, which pairs with it) leaves the averages alone.
    opt.apply_gradients([(tf.constant([np.inf, 0.0]), w)])
    opt.apply_gradients([(tf.constant([1.0, 0.0]), w)])
    after = monitor.values()
    assert np.isnan(after["gns_raw"]) and after["monitor_step"] == 4
    assert (after["grad_sq_norm"], after["noise_trace"]) == (values["grad_sq_norm"], values["noise_trace"])


def test_a_loss_scale_optimizer_feeds_the_monitor_true_gradients():
    """LossScaleOptimizer: the gradients that reach the wrapper are scaled; the monitor must see them unscaled.

    Before, tr(Σ) and |G|² came out multiplied by the loss scale squared (the GNS, their ratio, did not
    show it; AdaScale's learning rate reads them directly).
    """
    grads = [tf.constant([1.0, 0.0]), tf.constant([0.0, 1.0]), tf.constant([2.0, 1.0])]
    results = []
    for wrap in (False, True):
        monitor = GradientMonitor(batch_size=1, smoothing=0.0)
        inner = keras.optimizers.SGD(0.0)
        if wrap:
            inner = keras.optimizers.LossScaleOptimizer(inner, initial_scale=1024.0, dynamic_growth_steps=100)
        opt = SynchronousSGDOptimizer(inner, monitor=monitor)
        w = keras.Variable([1.0, 2.0])
        scale = 1024.0 if wrap else 1.0
        for g in grads:
            opt.apply_gradients([(g * scale, w)])  # as the gradient of opt.scale_loss(loss)
        results.append(monitor.values())
    plain, scaled = results
    assert plain["noise_trace"] > 0 and plain["grad_sq_norm"] > 0
    for key in ("noise_trace", "grad_sq_norm", "gns"):
        assert scaled[key] == pytest.approx(plain[key], rel=1e-6), (key, plain, scaled)


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


# ------------------------------------------- one worker: pairs, checkpoints


def _two_batch_estimates(small_sq: float, big_sq: float, small_b: float, big_b: float) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) of McCandlish et al. App. A.1, in plain Python (the reference)."""
    return (big_b * big_sq - small_b * small_sq) / (big_b - small_b), (small_sq - big_sq) / (1 / small_b - 1 / big_b)


def _pair_estimates(g: np.ndarray, previous: np.ndarray, b: int) -> tuple[float, float]:
    """The one-worker pair of two equal batches of ``b``: small = mean of both norms, big = norm of the mean."""
    mean = 0.5 * (g + previous)
    return _two_batch_estimates(0.5 * (g @ g + previous @ previous), mean @ mean, b, 2 * b)


def test_one_worker_skips_the_pair_across_a_batch_size_change():
    """The gradient before a batch-size change came from another batch size: no pair, the EMA is left alone."""
    monitor = GradientMonitor(batch_size=1, smoothing=0.0)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor)
    w = keras.Variable([1.0, 2.0])
    grads = [np.array(g) for g in ([1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [1.0, 2.0], [3.0, 1.0])]
    opt.apply_gradients([(tf.constant(grads[0], tf.float32), w)])
    opt.apply_gradients([(tf.constant(grads[1], tf.float32), w)])
    before = monitor.values()
    monitor.local_batch_size.assign(4)  # as the policy runner does
    opt.apply_gradients([(tf.constant(grads[2], tf.float32), w)])
    after_change = monitor.values()
    assert np.isnan(after_change["gns_raw"]), after_change
    assert (after_change["grad_sq_norm"], after_change["noise_trace"]) == (before["grad_sq_norm"], before["noise_trace"])
    assert int(monitor.ema_count.numpy()) == 1
    # The next step pairs two batches of 4.
    opt.apply_gradients([(tf.constant(grads[3], tf.float32), w)])
    grad_sq, trace = _pair_estimates(grads[3], grads[2], 4)
    values = monitor.values()
    assert values["grad_sq_norm"] == pytest.approx(grad_sq) and values["noise_trace"] == pytest.approx(trace)
    assert values["gns_raw"] == pytest.approx(trace / grad_sq) and int(monitor.ema_count.numpy()) == 2
    # Assigning the same size again changes nothing.
    monitor.local_batch_size.assign(4)
    opt.apply_gradients([(tf.constant(grads[4], tf.float32), w)])
    assert monitor.values()["gns_raw"] == pytest.approx(np.divide(*_pair_estimates(grads[4], grads[3], 4)[::-1]))


def _v1_monitored_graph():
    """A v1 graph training w with a monitor; returns (train_op, monitor, w). Built for kungfu_tf.size() at call time."""
    monitor = GradientMonitor(batch_size=2, smoothing=0.5)
    w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
    x = tf.compat.v1.placeholder(tf.float32, [2])
    opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.0), monitor=monitor)
    train_op = opt.minimize(tf.reduce_sum(w * x), global_step=tf.compat.v1.train.get_or_create_global_step())
    return train_op, monitor, x


def test_v1_checkpoint_from_a_larger_cluster_restores_into_the_one_worker_graph(tmp_path, monkeypatch):
    """The previous-gradient copy exists only in a one-worker graph; it is local, so no Saver saves or expects it."""
    import kungfu_tf

    ckpt_dir = str(tmp_path / "v1")
    saved = {"ema_noise_trace": 3.0, "ema_grad_sq_norm": 0.5, "ema_count": 1}
    with tf.Graph().as_default():
        with monkeypatch.context() as patch:
            patch.setattr(kungfu_tf, "size", lambda: 2)  # trace the step as a worker of two would
            _, monitor, _ = _v1_monitored_graph()
        assert monitor._previous is None
        per_worker = {v.op.name for v in tf.compat.v1.local_variables()}
        assert any("step_clock_anchor" in n for n in per_worker), per_worker
        assert not any("step_clock_anchor" in v.op.name for v in tf.compat.v1.global_variables())
        # A Saver of the global variables, as MonitoredTrainingSession's default Scaffold makes.
        with tf.compat.v1.Session() as sess:
            sess.run([tf.compat.v1.global_variables_initializer(), tf.compat.v1.local_variables_initializer()])
            for key, value in saved.items():
                getattr(monitor, key).load(value, sess)
            tf.compat.v1.train.Saver().save(sess, ckpt_dir + "/model.ckpt", global_step=0)
    names = [n for n, _ in tf.train.list_variables(ckpt_dir)]
    assert not any("previous" in n or "clock_anchor" in n for n in names), names

    with tf.Graph().as_default():
        train_op, monitor, x = _v1_monitored_graph()
        assert monitor._previous is not None  # a one-worker graph pairs with the previous gradient
        local_names = {v.op.name for v in tf.compat.v1.local_variables()}
        assert any("previous_gradient" in n for n in local_names), local_names
        with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=ckpt_dir, save_checkpoint_steps=None,
                                                         save_checkpoint_secs=None) as sess:  # fmt: skip
            assert {k: getattr(monitor, k).eval(sess) for k in saved} == saved
            # First step: no previous gradient (initialized by the local init op): the restored EMA stays.
            sess.run(train_op, feed_dict={x: [1.0, 0.0]})
            assert int(monitor.ema_count.eval(sess)) == 1
            sess.run(train_op, feed_dict={x: [0.0, 1.0]})
            values = monitor.values(session=sess)
    grad_sq, trace = _pair_estimates(np.array([0.0, 1.0]), np.array([1.0, 0.0]), 2)
    correction = 1 - 0.5**2
    assert values["noise_trace"] == pytest.approx((0.5 * saved["ema_noise_trace"] + 0.5 * trace) / correction)
    assert values["grad_sq_norm"] == pytest.approx((0.5 * saved["ema_grad_sq_norm"] + 0.5 * grad_sq) / correction)


def test_restore_into_a_fresh_monitor_continues_the_estimate(tmp_path):
    """tf.train.Checkpoint of the optimizer into new objects and a new tf.function; per-worker variables stay out."""

    def build():
        monitor = GradientMonitor(batch_size=2, smoothing=0.5)
        opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor, name="fresh_sgd")
        w = keras.Variable([1.0, 2.0], name="w_fresh")
        opt.build([w])

        @tf.function
        def step(g):
            opt.apply_gradients([(g, w)])

        return monitor, opt, step

    grads = [np.array(g, np.float32) for g in ([1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [1.0, 3.0], [2.0, 2.0])]
    monitor, opt, step = build()
    for g in grads[:3]:
        step(tf.constant(g))
    state = {k: getattr(monitor, k).numpy() for k in ("ema_noise_trace", "ema_grad_sq_norm", "ema_count")}
    values = monitor.values()
    path = tf.train.Checkpoint(optimizer=opt).save(str(tmp_path / "opt"))
    names = [n for n, _ in tf.train.list_variables(path)]
    assert any("ema_noise_trace" in n for n in names), names
    assert not any("previous" in n or "clock_anchor" in n for n in names), names

    fresh, fresh_opt, fresh_step = build()
    tf.train.Checkpoint(optimizer=fresh_opt).restore(path).assert_existing_objects_matched()
    restored = fresh.values()
    assert fresh is not monitor and restored.pop("worker_compute_times") == values.pop("worker_compute_times")
    assert restored == pytest.approx(values, nan_ok=True)
    # The fresh monitor has no previous gradient: its first step only keeps a copy, the second pairs.
    fresh_step(tf.constant(grads[3]))
    assert int(fresh.ema_count.numpy()) == state["ema_count"] == 2
    fresh_step(tf.constant(grads[4]))
    grad_sq, trace = _pair_estimates(grads[4].astype(np.float64), grads[3].astype(np.float64), 2)
    correction = 1 - 0.5**3
    want_trace = (0.5 * state["ema_noise_trace"] + 0.5 * trace) / correction
    want_grad = (0.5 * state["ema_grad_sq_norm"] + 0.5 * grad_sq) / correction
    got = fresh.values()
    assert got["noise_trace"] == pytest.approx(want_trace) and got["grad_sq_norm"] == pytest.approx(want_grad)
    assert got["gns"] == pytest.approx(want_trace / want_grad) and got["monitor_step"] == 5


@pytest.mark.parametrize("position, name", list(enumerate(
    ["small_sq_norm", "big_sq_norm", "small_batch", "big_batch", "valid", "ema_noise_trace", "ema_grad_sq_norm",
     "ema_count"])))  # fmt: skip
def test_gns_update_rejects_non_scalar_inputs(position, name):
    args = [tf.constant(5.0, tf.float64), tf.constant(3.0, tf.float64), tf.constant(4.0, tf.float64),
            tf.constant(12.0, tf.float64), tf.constant(True), tf.constant(0.0, tf.float64),
            tf.constant(0.0, tf.float64), tf.constant(0, tf.int64)]  # fmt: skip
    args[position] = tf.stack([args[position], args[position]])
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"KungfuGnsUpdate: input '{name}' must be a scalar, got shape \[2\]"):
        monitor_ops.gns_update(*args, smoothing=0.5)


def test_step_clock_lap_rejects_a_non_scalar_start():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"KungfuStepClockLap: input 'start_ns' must be a scalar"):
        monitor_ops.step_clock_lap(tf.constant([1, 2], tf.int64), [])


def test_step_clock_starts_with_the_step_on_every_step_with_one_inter_op_thread():
    """With one inter-op thread (kungfu-run's workers, the elastic tests) the clock start op ran after the
    gradients on some steps, or on every step once TF's cost estimates had settled (from step ~94 on,
    compute_time ~1 us): the per-worker compute time a StragglerPolicy compares was meaningless."""
    import subprocess
    import sys

    from conftest import worker_env, worker_path

    proc = subprocess.run([sys.executable, worker_path("step_clock_steps.py"), "300"], check=False, env=worker_env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "short 0 of 300:" in proc.stdout, proc.stdout
