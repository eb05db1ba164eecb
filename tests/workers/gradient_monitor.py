"""Worker for tests/test_gradient_monitor.py: GradientMonitor against closed forms and numpy.

Usage: gradient_monitor.py NP CHECKPOINT_DIR

Linear regression y = x.w* + e, x ~ N(0, I_D), e ~ N(0, SIGMA^2), loss
0.5 (x.w - y)^2, evaluated at fixed weights w0 = w* + delta (learning rate
0, so every step samples the same gradient distribution). Per example,
g = (x.delta - e) x, hence (Gaussian fourth moments)

    G = delta,  Sigma = (|delta|^2 + SIGMA^2) I + delta delta^T,
    |G|^2 = |delta|^2 = 1,  tr(Sigma) = D (1 + SIGMA^2) + 1,  B_simple = tr(Sigma) / |G|^2 = 6.

Every worker draws its batch of step t from seed (t, rank), so each worker
can rebuild every worker's gradients in numpy. Checked on every rank:

* function (tf.function loop, Keras SGD(0), variance every 3 steps, T_LONG
  steps): each step's monitored values equal a numpy replay of the same
  estimator on the same data (rtol 1e-4), the gradient variance equals
  numpy's var over the workers' gradients, and the final smoothed GNS is
  within GNS_RTOL of the true 6 (the estimator's relative standard deviation
  at this setting, by simulation over 200 seeds, is 6 % at np 1, 5.5 % at
  np 2, 2.8 % at np 4: GNS_RTOL = 25 % is >= 4 standard deviations);
* checkpoint: tf.train.Checkpoint(monitor=...) restores every monitored
  value and the EMA state after they were overwritten; a checkpoint of the
  optimizer holds the monitor too, and restored into a new optimizer and
  monitor with a new tf.function it continues the same estimate;
* keras (Model.fit, "mse" loss: twice the gradient, four times both norms)
  and v1 (graph + MonitoredTrainingSession, GradientDescentOptimizer(0))
  and strategy (tf.function, the 'AllReduce' builder): numpy replay;
* compute times: the last rank sleeps SLEEP s inside its forward pass
  (tf.py_function); worker_compute_times shows it (at least SLEEP / 2), the
  others' stay under SLEEP / 2 although they wait for it in the all-reduce.

Ends with "checked N results"; N is expected_checks() in the test.
"""

from __future__ import annotations

import copy
import os
import sys
import time

import _setup
import keras
from _setup import Checker, np, ops, seed_of, tf

from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer

D, B, SIGMA = 4, 32, 0.5
W_STAR = np.linspace(-1.0, 1.0, D)
DELTA = np.array([0.6, 0.8, 0.0, 0.0])
W0 = W_STAR + DELTA
TRUE_GNS = D * (1 + SIGMA**2) + 1.0
T_LONG, T_SHORT = 300, 12
SMOOTHING = 0.995
VARIANCE_INTERVAL = 3
GNS_RTOL = 0.25
RTOL = 1e-4
SLEEP = 1.0  # s: the slow rank's pause; the others' compute (a tiny matvec) stays far below SLEEP / 2 under load


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed_of("gns", step, rank))
    x = rng.standard_normal((B, D))
    y = x @ W_STAR + SIGMA * rng.standard_normal(B)
    return x.astype(np.float32), y.astype(np.float32)


def gradient(step: int, rank: int) -> np.ndarray:
    """d/dw of mean 0.5 (x.w0 - y)^2 over the batch, from the float32 data, in float64."""
    x, y = (a.astype(np.float64) for a in batch(step, rank))
    return ((x @ W0.astype(np.float32).astype(np.float64) - y)[:, None] * x).mean(axis=0)


class Replay:
    """The monitor's estimator in numpy, step by step (scale: gradient multiplier, e.g. 2 for 'mse')."""

    def __init__(self, size: int, scale: float = 1.0) -> None:
        self.size, self.scale = size, scale
        self.ema_trace = self.ema_grad = 0.0
        self.count = 0
        self.previous = None
        self.variance = float("nan")

    def step(self, t: int) -> dict[str, float]:
        gs = [self.scale * gradient(t, r) for r in range(self.size)]
        if t % VARIANCE_INTERVAL == 0:
            self.variance = float(np.mean(np.var(np.stack(gs), axis=0)))
        valid = True
        if self.size == 1:
            g = gs[0]
            if self.previous is None:
                valid = False
            else:
                small = 0.5 * (g @ g + self.previous @ self.previous)
                mean = 0.5 * (g + self.previous)
                big, bs, bb = mean @ mean, B, 2 * B
            self.previous = g
        else:
            small = float(np.mean([g @ g for g in gs]))
            mean = np.mean(gs, axis=0)
            big, bs, bb = mean @ mean, B, B * self.size
        out = {"grad_variance": self.variance}
        if valid:
            grad_sq = (bb * big - bs * small) / (bb - bs)
            trace = (small - big) / (1 / bs - 1 / bb)
            s = SMOOTHING
            self.ema_trace = s * self.ema_trace + (1 - s) * trace
            self.ema_grad = s * self.ema_grad + (1 - s) * grad_sq
            self.count += 1
            out["gns_raw"] = trace / grad_sq
        else:
            out["gns_raw"] = float("nan")
        if self.count:
            c = 1 - SMOOTHING**self.count
            out["noise_trace"] = self.ema_trace / c
            out["grad_sq_norm"] = self.ema_grad / c
            out["gns"] = out["noise_trace"] / out["grad_sq_norm"]
        else:
            out.update(noise_trace=float("nan"), grad_sq_norm=float("nan"), gns=float("nan"))
        return out


def close(chk: Checker, got: float, want: float, what: str, rtol: float = RTOL, atol: float = 0.0) -> None:
    if np.isnan(want) and np.isnan(got):
        chk.count += 1
        return
    if not np.isclose(got, want, rtol=rtol, atol=atol):
        chk.fail(what, f"got {got!r}, want {want!r} (rtol {rtol}, atol {atol})")
    chk.count += 1


def compare(chk: Checker, values: dict, want: dict, what: str, keys=None) -> None:
    for key in keys or sorted(want):
        # The variance is a difference of float32 squares: absolute error ~ 1e-7 E[g^2].
        atol = 1e-5 if key == "grad_variance" else 0.0
        close(chk, values[key], want[key], f"{what}: {key}", atol=atol)


def linear_model() -> keras.Model:
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(W0.reshape(D, 1).astype(np.float32))
    return model


def check_function(chk: Checker, rank: int, size: int, ckpt_dir: str) -> None:
    monitor = GradientMonitor(batch_size=B, smoothing=SMOOTHING, variance_interval=VARIANCE_INTERVAL)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor, name="fn_sgd")
    w = keras.Variable(W0.astype(np.float32), name="w")

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.linalg.matvec(x, w.value) - y))
        opt.apply_gradients([(tape.gradient(loss, w.value), w)])
        # The monitored values, read as tensors inside the step.
        return monitor.tensors["gns_raw"].read_value(), monitor.tensors["monitor_step"].read_value()

    replay = Replay(size)
    for t in range(T_LONG):
        inside, step_no = train_step(*batch(t, rank))
        want = replay.step(t)
        if t < 10 or t % 50 == 0 or t == T_LONG - 1:
            values = monitor.values()
            compare(chk, values, want, f"function step {t}")
            close(chk, float(inside), values["gns_raw"], f"function step {t}: gns_raw read inside the step")
            chk.true(int(step_no) == t + 1 == values["monitor_step"], f"function step {t}: monitor_step {step_no}")
    values = monitor.values()
    gns = values["gns"]
    print(f"np={size}: GNS {gns:.3f} (true {TRUE_GNS}), |G|^2 {values['grad_sq_norm']:.3f} (true 1), "
          f"tr(Sigma) {values['noise_trace']:.3f} (true {TRUE_GNS}), variance {values['grad_variance']:.4g}",
          flush=True)
    chk.true(abs(gns / TRUE_GNS - 1) <= GNS_RTOL, f"GNS {gns} within {GNS_RTOL:.0%} of the true {TRUE_GNS}")
    chk.true(len(values["worker_compute_times"]) == size, "one compute time per worker")

    # Checkpoint: overwrite everything, restore, compare.
    saved_state = {v.name: v.numpy() for v in monitor.variables}
    path = tf.train.Checkpoint(monitor=monitor).save(os.path.join(ckpt_dir, f"rank{rank}", "monitor"))
    for v in monitor.variables:
        v.assign(tf.zeros_like(v) if v.dtype == tf.int64 else tf.fill(tf.shape(v), tf.constant(-1.0, v.dtype)))
    tf.train.Checkpoint(monitor=monitor).restore(path).assert_consumed()
    restored = {v.name: v.numpy() for v in monitor.variables}
    chk.true(sorted(saved_state) == sorted(restored), "checkpoint: same variables")
    for name, value in saved_state.items():
        chk.true(np.array_equal(value, restored[name], equal_nan=True), f"checkpoint restores {name}")
    opt_path = tf.train.Checkpoint(optimizer=opt).save(os.path.join(ckpt_dir, f"rank{rank}", "optimizer"))
    names = [n for n, _ in tf.train.list_variables(opt_path)]
    chk.true(any("kungfu_monitor/ema_noise_trace" in n for n in names), f"optimizer checkpoint holds the monitor: {names}")
    # The restored monitor continues the same estimate.
    fresh_replay = copy.deepcopy(replay)
    train_step(*batch(T_LONG, rank))
    compare(chk, monitor.values(), replay.step(T_LONG), "function after restore")

    # Restored into new objects (monitor, optimizer, tf.function), as after a restart.
    fresh = GradientMonitor(batch_size=B, smoothing=SMOOTHING, variance_interval=VARIANCE_INTERVAL)
    fresh_opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=fresh, name="fresh_sgd")
    fresh_opt.build([w])
    tf.train.Checkpoint(optimizer=fresh_opt).restore(opt_path).assert_existing_objects_matched()
    for old, new in zip(saved_state.values(), fresh.variables):
        chk.true(np.array_equal(old, new.numpy(), equal_nan=True), f"fresh monitor restores {new.name}")

    @tf.function
    def fresh_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.linalg.matvec(x, w.value) - y))
        fresh_opt.apply_gradients([(tape.gradient(loss, w.value), w)])

    fresh_replay.previous = None  # one worker: a new monitor has no previous gradient to pair with
    fresh_step(*batch(T_LONG, rank))
    compare(chk, fresh.values(), fresh_replay.step(T_LONG), "fresh monitor after restore")


def check_keras(chk: Checker, rank: int, size: int) -> None:
    monitor = GradientMonitor(batch_size=B, smoothing=SMOOTHING, variance_interval=VARIANCE_INTERVAL)
    model = linear_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor, name="keras_sgd")
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    data = [batch(t, rank) for t in range(T_SHORT)]
    x = np.concatenate([d[0] for d in data])
    y = np.concatenate([d[1] for d in data])[:, None]
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
    replay = Replay(size, scale=2.0)  # 'mse' = mean (x.w - y)^2: twice our gradient
    for t in range(T_SHORT):
        want = replay.step(t)
    compare(chk, monitor.values(), want, "keras fit")
    chk.true(monitor.values()["monitor_step"] == T_SHORT, "keras fit: monitor_step")


def check_v1(chk: Checker, rank: int, size: int) -> None:
    with tf.Graph().as_default():
        monitor = GradientMonitor(batch_size=B, smoothing=SMOOTHING, variance_interval=VARIANCE_INTERVAL)
        x = tf.compat.v1.placeholder(tf.float32, [B, D])
        y = tf.compat.v1.placeholder(tf.float32, [B])
        w = tf.compat.v1.get_variable("w", initializer=W0.astype(np.float32))
        loss = 0.5 * tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) - y))
        opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.0), monitor=monitor)
        chk.true(opt.kungfu_monitor is monitor, "v1: kungfu_monitor")
        train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        replay = Replay(size)
        with tf.compat.v1.train.MonitoredTrainingSession(config=_setup.session_config()) as sess:
            for t in range(T_SHORT):
                xs, ys = batch(t, rank)
                sess.run(train_op, feed_dict={x: xs, y: ys})
                want = replay.step(t)
            compare(chk, monitor.values(session=sess), want, "v1 MonitoredTrainingSession")


def check_strategy(chk: Checker, rank: int, size: int) -> None:
    from kungfu_tf.strategy import builders

    monitor = GradientMonitor(batch_size=B, smoothing=SMOOTHING, variance_interval=VARIANCE_INTERVAL)
    opt = SynchronousSGDOptimizer(
        keras.optimizers.SGD(0.0), strategy=builders.AllReduce(), monitor=monitor, name="strategy_sgd"
    )
    w = keras.Variable(W0.astype(np.float32), name="w_strategy")
    opt.build([w])

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.linalg.matvec(x, w.value) - y))
        opt.apply_gradients([(tape.gradient(loss, w.value), w)])

    replay = Replay(size)
    for t in range(T_SHORT):
        train_step(*batch(t, rank))
        want = replay.step(t)
    compare(chk, monitor.values(), want, "strategy AllReduce")


def check_compute_times(chk: Checker, rank: int, size: int) -> None:
    slow = size - 1
    monitor = GradientMonitor(batch_size=B, gns=False)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor, name="clock_sgd")
    w = keras.Variable(W0.astype(np.float32), name="w_clock")

    def pause() -> np.float32:
        time.sleep(SLEEP)
        return np.float32(0.0)

    @tf.function
    def train_step(x, y):
        if rank == slow:
            # The forward pass waits for the pause, so the gradients do too.
            x = x + tf.py_function(pause, [], tf.float32)
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.linalg.matvec(x, w.value) - y))
        opt.apply_gradients([(tape.gradient(loss, w.value), w)])

    for t in range(3):
        train_step(*batch(t, rank))
        values = monitor.values()
        times = values["worker_compute_times"]
        print(f"step {t}: worker_compute_times {[round(v, 4) for v in times]}", flush=True)
        chk.true(len(times) == size, "compute times: one per worker")
        close(chk, times[rank], values["compute_time"], "compute times: own entry", rtol=1e-5, atol=1e-6)
        # The monitor's clock starts at an op of the step that nothing orders before the pause (the py_function
        # may begin a little earlier: 0.9993 s was measured once in CI), so the slow rank's time is compared
        # with the same half-pause bound as the others', from the other side.
        chk.true(times[slow] >= SLEEP / 2, f"compute times: the slow rank {slow} took >= {SLEEP / 2} s: {times}")
        for r in range(size - 1):
            # They wait SLEEP s for the slow worker, but that is not compute time.
            chk.true(times[r] < SLEEP / 2, f"compute times: rank {r} excludes the wait: {times}")


def main() -> None:
    size, ckpt_dir = int(sys.argv[1]), sys.argv[2]
    rank = ops.rank().numpy().item()
    assert ops.cluster_size().numpy() == size
    chk = Checker(rank)
    for part in (check_function, check_keras, check_v1, check_strategy, check_compute_times):
        start = time.perf_counter()
        part(chk, rank, size, ckpt_dir) if part is check_function else part(chk, rank, size)
        if rank == 0:
            print(f"{part.__name__}: {time.perf_counter() - start:.1f} s", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
