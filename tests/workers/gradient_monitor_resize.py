"""Worker for tests/test_gradient_monitor_resize.py: the GradientMonitor across a resize, against numpy.

Usage: gradient_monitor_resize.py FROM_SIZE BEFORE AFTER TO_SIZE LR [CRASH_RANKS]

``kungfu-run --elastic -np N1 --max-np 3``: a custom loop in ``kungfu_tf.elastic.run`` trains the linear
regression of tests/workers/gradient_monitor.py (simple noise scale 6 in closed form at the fixed weights
of learning rate 0) with ``SynchronousSGDOptimizer(SGD(LR), monitor=GradientMonitor(...))`` and
``ElasticState(model=, optimizer=)``. After BEFORE steps every member calls ``resize(TO_SIZE)`` (a growth
waits for the launcher's joiners; a shrink detaches the highest ranks), then the job trains AFTER more
steps. The step is traced once, at the size the worker had when it first ran it (a joiner: alone, in
its warm-up).

With CRASH_RANKS (e.g. ``1,3``; ``kungfu-run --min-np TO_SIZE -np FROM_SIZE``, no replacements) there is
no resize: as step BEFORE begins, the workers of those initial ranks kill themselves (SIGKILL) while the
others enter the step; their all-reduce fails, ``elastic.run`` recovers on the survivors (renumbered) and
the step runs again at TO_SIZE workers.

Every step's cluster size is recorded in the ``ElasticState`` (``sizes``, committed with the step, so a
step that failed is not recorded and a joiner receives the members' record). Every worker replays the
monitor's estimator in numpy over those sizes (each worker's batch of step t comes from seed (t, rank),
so anyone can rebuild everyone's gradients; with LR > 0 the replay carries the weights too) and checks,
after every step it trains: the record follows the schedule; gns_raw, noise_trace, grad_sq_norm and gns
equal the replay's (relative 1e-4 at LR 0, 1e-3 with LR > 0), every worker holds bitwise the same
monitored values (an all-gather), and worker_compute_times has one entry per worker. A joiner compares
from its first step in the cluster on: the smoothed state it received must be the members'. At the end
the smoothed noise_trace, grad_sq_norm and gns must each be within 25 % of the closed form smoothed the
same way (tr(Sigma) = (D + 1) |w - w*|^2 + D sigma^2 and |G|^2 = |w - w*|^2 at each step's weights;
constant at LR 0). Prints ``final gns G size S step N`` and ``checked N results``.
"""

from __future__ import annotations

import os
import signal
import sys

import keras
from _setup import Checker, np, ops, seed_of, tf

import kungfu_tf
from kungfu_tf import elastic
from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer

D, B, SIGMA, SMOOTHING = 4, 16, 0.5, 0.98
W_STAR = np.linspace(-1.0, 1.0, D)
W0 = W_STAR + np.array([0.6, 0.8, 0.0, 0.0])
KEYS = ("gns_raw", "noise_trace", "grad_sq_norm", "gns", "monitor_step")
SMOOTHED = ("noise_trace", "grad_sq_norm", "gns")


def closed_form(w: np.ndarray) -> tuple[float, float]:
    """(tr(Sigma), |G|^2) of one example's gradient at weights ``w``, for x ~ N(0, I) and noise sigma."""
    d = w - W_STAR
    return (D + 1) * float(d @ d) + D * SIGMA**2, float(d @ d)


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed_of("gns-resize", step, rank))
    x = rng.standard_normal((B, D))
    y = x @ W_STAR + SIGMA * rng.standard_normal(B)
    return x.astype(np.float32), y.astype(np.float32)


class Replay:
    """The monitor's estimator in numpy for a cluster whose size changes between steps."""

    def __init__(self, lr: float) -> None:
        self.lr, self.w = lr, W0.astype(np.float32).astype(np.float64)
        self.ema_trace = self.ema_grad = 0.0
        self.ema_true_trace = self.ema_true_grad = 0.0  # the closed form, smoothed as the estimates are
        self.count = 0
        self.previous: np.ndarray | None = None  # a one-worker step's gradient; forgotten at several workers

    def step(self, t: int, size: int) -> dict[str, float]:
        gs = []
        for r in range(size):
            x, y = (a.astype(np.float64) for a in batch(t, r))
            gs.append(((x @ self.w - y)[:, None] * x).mean(axis=0))
        valid = True
        if size == 1:
            g = gs[0]
            valid = self.previous is not None
            if valid:
                small, mean = 0.5 * (g @ g + self.previous @ self.previous), 0.5 * (g + self.previous)
                big, bs, bb = mean @ mean, B, 2 * B
            self.previous = g
        else:
            small, mean = float(np.mean([g @ g for g in gs])), np.mean(gs, axis=0)
            big, bs, bb = mean @ mean, B, B * size
            self.previous = None
        out = {"gns_raw": float("nan")}
        if valid:
            grad_sq, trace = (bb * big - bs * small) / (bb - bs), (small - big) / (1 / bs - 1 / bb)
            self.ema_trace = SMOOTHING * self.ema_trace + (1 - SMOOTHING) * trace
            self.ema_grad = SMOOTHING * self.ema_grad + (1 - SMOOTHING) * grad_sq
            true_trace, true_grad_sq = closed_form(self.w)
            self.ema_true_trace = SMOOTHING * self.ema_true_trace + (1 - SMOOTHING) * true_trace
            self.ema_true_grad = SMOOTHING * self.ema_true_grad + (1 - SMOOTHING) * true_grad_sq
            self.count += 1
            out["gns_raw"] = trace / grad_sq
        c = 1 - SMOOTHING**self.count
        out["noise_trace"] = self.ema_trace / c if self.count else float("nan")
        out["grad_sq_norm"] = self.ema_grad / c if self.count else float("nan")
        out["gns"] = out["noise_trace"] / out["grad_sq_norm"] if self.count else float("nan")
        out["closed_form"] = {  # what the smoothed estimates estimate
            "noise_trace": self.ema_true_trace / c if self.count else float("nan"),
            "grad_sq_norm": self.ema_true_grad / c if self.count else float("nan"),
            "gns": self.ema_true_trace / self.ema_true_grad if self.count else float("nan"),
        }
        self.w = self.w - self.lr * np.mean(gs, axis=0)
        return out


def main(from_size: int, before: int, after: int, to_size: int, lr: float, crash_ranks: frozenset[int]) -> None:
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(W0.reshape(D, 1).astype(np.float32))
    monitor = GradientMonitor(batch_size=B, smoothing=SMOOTHING)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(lr), monitor=monitor, name="gns_resize_sgd")
    state = elastic.ElasticState(model=model, optimizer=opt, sizes=[])  # sizes[t]: the size step t ran at
    rtol = 1e-4 if lr == 0 else 1e-3

    @tf.function(input_signature=(tf.TensorSpec([None, D], tf.float32), tf.TensorSpec([None], tf.float32)))
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.reshape(model(x), [-1]) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    def warm_up(state: elastic.ElasticState) -> None:
        train_step(*batch(10_000, 0))  # alone: traced at one worker

    replay, replayed = Replay(lr), []

    def size_at(t: int) -> int:
        return from_size if t < before else to_size

    chk = Checker(kungfu_tf.rank())
    crashes = kungfu_tf.rank() in crash_ranks and not elastic.is_joiner()  # the initial rank

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> bool:
        while state.step < before + after:
            state.check()
            t, rank, size = state.step, kungfu_tf.rank(), kungfu_tf.size()
            if crashes and t == before:
                print(f"crashes at step {t}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # its peers are entering the step
            train_step(*batch(t, rank))
            state.sizes.append(size)
            state.commit()
            chk.true(state.sizes == [size_at(s) for s in range(t + 1)],
                     f"step {t}: steps ran at {state.sizes}, the schedule says {from_size} then {to_size} from {before}")  # fmt: skip
            while len(replayed) <= t:  # a joiner replays the steps before it joined too
                replayed.append(replay.step(len(replayed), state.sizes[len(replayed)]))
            want, values = replayed[t], monitor.values()
            for key in KEYS[:4]:
                if not (np.isnan(want[key]) and np.isnan(values[key])) and not np.isclose(values[key], want[key], rtol=rtol):
                    chk.fail(f"step {t} at {size} workers: {key} {values[key]!r}, the numpy replay {want[key]!r}")
                chk.count += 1
            chk.true(len(values["worker_compute_times"]) == size, f"step {t}: one compute time per worker")
            mine = np.array([values[k] for k in KEYS], np.float64)
            every = ops.all_gather(tf.constant(mine), name="gns-resize/values").numpy()
            chk.true(all(np.array_equal(row, every[0], equal_nan=True) for row in every),
                     f"step {t}: the monitored values differ between workers: {every.tolist()}")  # fmt: skip
            if state.step == before and size != to_size and not crash_ranks:
                _, detached = elastic.resize(to_size, wait=True)
                if bool(detached):
                    return True
        return False

    detached = bool(train(state))
    if detached:
        print("detached", flush=True)
        return
    values, truth = monitor.values(), replayed[-1]["closed_form"]
    print(f"final gns {values['gns']:.4f} size {kungfu_tf.size()} step {state.step}", flush=True)
    print("final " + ", ".join(f"{k} {values[k]:.4f} (closed form {truth[k]:.4f})" for k in SMOOTHED), flush=True)
    for key in SMOOTHED:  # AdaScale reads the two parts, not only their ratio
        chk.true(abs(values[key] / truth[key] - 1) <= 0.25, f"{key} {values[key]} within 25 % of the closed form {truth[key]}")
    chk.done()


if __name__ == "__main__":
    crash = frozenset(int(r) for r in sys.argv[6].split(",")) if len(sys.argv) > 6 else frozenset()
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]), crash)
