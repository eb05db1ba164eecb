"""Worker for tests/test_model_averaging.py: SMA and pair averaging in tf.compat.v1 graphs.

Usage: model_averaging_v1.py NP

The digits MLP (64-128-10, models/digits.py's data) written as a v1 graph,
``tf.compat.v1.train.MomentumOptimizer`` wrapped by the kungfu_tf factory,
trained with ``MonitoredTrainingSession`` and
``kungfu_tf.v1.BroadcastGlobalVariablesHook``. Each worker starts from its
own random weights (the hook makes them rank 0's) and trains on its own
shard of the training split (rows rank, rank+NP, ...):

* v1_sma: SynchronousAveragingOptimizer(alpha=0.1) for STEPS steps reaches
  held-out accuracy >= ACCURACY;
* v1_sma_alpha1: with alpha=1.0, after each of ALPHA1_STEPS steps all workers
  hold identical weights (a consensus), and the weights changed;
* v1_pair_closer (NP=2): from different weights (no broadcast hook), one
  pair-averaging step brings the two models within CLOSER x their initial
  distance, while one plain step leaves them beyond PLAIN x;
* v1_pair: PairAveragingOptimizer for STEPS steps reaches held-out accuracy
  >= ACCURACY; every worker's global step is STEPS.

Ends with "checked N results"; N is expected_v1_checks() in the test.
"""

from __future__ import annotations

import sys

import _setup
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.optimizers import PairAveragingOptimizer, SynchronousAveragingOptimizer
from kungfu_tf.v1 import BroadcastGlobalVariablesHook
from models.digits import load_digits_split

HIDDEN, CLASSES = 128, 10
BATCH, STEPS, ALPHA1_STEPS = 32, 220, 4
LR, MOMENTUM = 0.05, 0.9
ACCURACY = 0.90


def initial_weights(rank: int, features: int) -> list[np.ndarray]:
    """Glorot-uniform weights that differ per rank, zero biases."""
    rng = np.random.default_rng(100 + rank)

    def glorot(fan_in: int, fan_out: int) -> np.ndarray:
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

    return [glorot(features, HIDDEN), np.zeros(HIDDEN, np.float32), glorot(HIDDEN, CLASSES),
            np.zeros(CLASSES, np.float32)]  # fmt: skip


def accuracy(weights: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    w1, b1, w2, b2 = weights
    logits = np.maximum(x @ w1 + b1, 0.0) @ w2 + b2
    return float(np.mean(np.argmax(logits, axis=1) == y))


def train(rank: int, xs, ys, wrap, steps: int, after_step=None, broadcast: bool = True) -> tuple[list[np.ndarray], int]:
    """``steps`` steps of the wrapped optimizer; returns the final weights and global step.

    ``after_step(s, flat, agree, gathered)`` gets this worker's weights, whether
    all workers agree on them, and every worker's weights (stacked).
    """
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, [None, xs.shape[1]])
        yp = tf.compat.v1.placeholder(tf.int32, [None])
        variables = [tf.compat.v1.get_variable(f"w{i}", initializer=tf.constant(v))
                     for i, v in enumerate(initial_weights(rank, xs.shape[1]))]  # fmt: skip
        w1, b1, w2, b2 = variables
        logits = tf.matmul(tf.nn.relu(tf.matmul(xp, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=yp, logits=logits))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        opt = wrap(tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM))
        train_op = opt.minimize(loss, global_step=global_step)
        flat = tf.concat([tf.reshape(v, [-1]) for v in variables], 0)
        # Run only by after_step: True iff every worker holds the same weights.
        agree = ops.consensus(flat, name="agree")
        gathered = ops.all_gather(flat, name="gathered")
        hooks = [BroadcastGlobalVariablesHook(root=0)] if broadcast else []
        n = len(xs) // BATCH
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks, config=_setup.session_config()) as sess:
            for s in range(steps):
                i = s % n
                sess.run(train_op, {xp: xs[i * BATCH : (i + 1) * BATCH], yp: ys[i * BATCH : (i + 1) * BATCH]})
                if after_step is not None:
                    after_step(s, *sess.run([flat, agree, gathered]))
            return sess.run(variables), int(sess.run(global_step))


CLOSER, PLAIN = 0.5, 0.9


def check_pair_closer(chk: Checker, rank: int, xs, ys) -> None:
    """From different weights (no broadcast), one pair-averaging step brings the two models
    together (< CLOSER x the initial distance); one plain step does not (> PLAIN x)."""
    inits = [np.concatenate([w.reshape(-1) for w in initial_weights(r, xs.shape[1])]) for r in (0, 1)]
    d0 = float(np.linalg.norm(inits[0] - inits[1]))
    for wrap in (True, False):
        after = {}

        def record(_s, _flat, _same, gathered, after=after):
            after["d"] = float(np.linalg.norm(gathered[0] - gathered[1]))

        opt = (lambda o: PairAveragingOptimizer(o, name="v1_pair_closer")) if wrap else (lambda o: o)
        train(rank, xs, ys, opt, 1, after_step=record, broadcast=False)
        d1 = after["d"]
        print(f"v1_pair_closer wrap={wrap} distance {d0:.4f} -> {d1:.4f}", flush=True)
        if wrap:
            chk.true(d1 < CLOSER * d0, f"v1_pair_closer: distance {d0:.4f} -> {d1:.4f}, not < {CLOSER}x")
        else:
            chk.true(d1 > PLAIN * d0, f"v1_pair_closer control: distance {d0:.4f} -> {d1:.4f}, not > {PLAIN}x")


def main() -> None:
    size = int(sys.argv[1])
    rank = kungfu_tf.rank()
    assert kungfu_tf.size() == size, (kungfu_tf.size(), size)
    chk = Checker(rank)
    x_train, y_train, x_test, y_test = load_digits_split(test_fraction=0.2, seed=0)
    xs, ys = x_train[rank::size].astype(np.float32), y_train[rank::size].astype(np.int32)

    weights, _ = train(rank, xs, ys, lambda o: SynchronousAveragingOptimizer(o, alpha=0.1, name="v1_sma"), STEPS)
    acc = accuracy(weights, x_test, y_test)
    print(f"v1_sma accuracy {acc:.4f}", flush=True)
    chk.true(acc >= ACCURACY, f"v1_sma: accuracy {acc:.4f} < {ACCURACY}")

    start = np.concatenate([w.reshape(-1) for w in initial_weights(0, xs.shape[1])])

    def identical(s: int, flat: np.ndarray, same: bool, _gathered: np.ndarray) -> None:
        chk.true(bool(same), f"v1_sma_alpha1: workers differ after step {s}")
        if s == ALPHA1_STEPS - 1:
            chk.true(not np.array_equal(flat, start), "v1_sma_alpha1: weights did not change")

    wrap = lambda o: SynchronousAveragingOptimizer(o, alpha=1.0, name="v1_sma_alpha1")
    train(rank, xs, ys, wrap, ALPHA1_STEPS, after_step=identical)

    if size == 2:
        check_pair_closer(chk, rank, xs, ys)
    weights, step = train(rank, xs, ys, lambda o: PairAveragingOptimizer(o, name="v1_pair"), STEPS)
    acc = accuracy(weights, x_test, y_test)
    print(f"v1_pair accuracy {acc:.4f}", flush=True)
    chk.true(acc >= ACCURACY, f"v1_pair: accuracy {acc:.4f} < {ACCURACY}")
    chk.true(step == STEPS, f"v1_pair: global step {step}, expected {STEPS}")
    ops.barrier(name="v1_end")
    chk.done()


if __name__ == "__main__":
    main()
