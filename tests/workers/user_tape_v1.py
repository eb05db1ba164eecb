"""Worker for tests/test_user_scripts.py: a ``tf.compat.v1.train`` optimizer wrapped in
SynchronousSGDOptimizer, driven the ways user scripts drive it.

Every worker has its own data; synchronous SGD must leave all of them at the
weights numpy computes for the average gradient (here float64, on the whole
global batch), whichever path applies the gradients:

* scalar: the issue's script, ``w`` pulled toward ``rank + 1`` by a tape loop
  with eager ``apply_gradients``: S-SGD gives the mean target on every rank;
* tape: a linear model of Keras 3 variables (``keras.Variable``, as a Keras
  model's ``trainable_variables`` are), tape + ``apply_gradients`` inside a
  ``tf.function``, v1 MomentumOptimizer;
* compute_apply / minimize: the same model as ``tf.compat.v1`` variables in a
  graph, trained by ``compute_gradients`` + ``apply_gradients`` and by
  ``minimize``.

Each path checks its weights against numpy (atol 1e-5) and against the other
workers (consensus). Ends with "checked N results" (N = 10 on every rank).
"""

from __future__ import annotations

import _setup
import keras
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.optimizers import SynchronousSGDOptimizer

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()
STEPS, B, FEATURES, OUTPUTS = 5, 3, 4, 2
LR, MOMENTUM = 0.05, 0.9


def rank_data(r: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker r's STEPS batches of B rows: different on every worker."""
    rng = np.random.default_rng(40 + r)
    return (rng.normal(size=(STEPS, B, FEATURES)), rng.normal(size=(STEPS, B, OUTPUTS)))


def initial() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(9)  # the same on every worker
    return rng.normal(size=(FEATURES, OUTPUTS)), rng.normal(size=(OUTPUTS,))


def numpy_ssgd() -> tuple[np.ndarray, np.ndarray]:
    """Momentum SGD (TF v1: a = m·a + g; w -= lr·a) on the mean of every worker's gradient."""
    w, b = initial()
    aw, ab = np.zeros_like(w), np.zeros_like(b)
    data = [rank_data(r) for r in range(SIZE)]
    for s in range(STEPS):
        gw, gb = np.zeros_like(w), np.zeros_like(b)
        for x, y in data:
            err = x[s] @ w + b - y[s]  # loss = mean over the B·OUTPUTS entries of err²
            gw += 2 * x[s].T @ err / err.size / SIZE
            gb += 2 * err.sum(axis=0) / err.size / SIZE
        aw, ab = MOMENTUM * aw + gw, MOMENTUM * ab + gb
        w, b = w - LR * aw, b - LR * ab
    return w, b


def check(chk: Checker, what: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    flat = np.concatenate([np.asarray(g, np.float64).reshape(-1) for g in got])
    chk.true(bool(ops.consensus(tf.constant(flat), name=f"agree/{what}").numpy()), f"{what}: workers differ")
    for i, (g, w) in enumerate(zip(got, want)):
        chk.close(g, w, 1e-5, f"{what}: weight {i} vs numpy synchronous SGD")


def scalar(chk: Checker) -> None:
    w = tf.Variable(0.0)
    opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0), name="scalar")
    with tf.GradientTape() as tape:
        loss = 0.5 * tf.square(w - float(RANK + 1))
    grads = tape.gradient(loss, [w])
    opt.apply_gradients(zip(grads, [w]))  # w = 0 - (0 - (rank + 1)) on its own
    chk.close(w.numpy(), np.mean(np.arange(SIZE) + 1.0), 1e-6, "scalar: mean target")


def tape_keras_variables(chk: Checker) -> None:
    w0, b0 = initial()
    w, b = keras.Variable(w0.astype(np.float32)), keras.Variable(b0.astype(np.float32))
    opt = SynchronousSGDOptimizer(tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM), name="tape")
    x, y = rank_data(RANK)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) + b - yb))
        grads = tape.gradient(loss, [w, b])
        opt.apply_gradients(zip(grads, [w, b]))

    for s in range(STEPS):
        step(tf.constant(x[s], tf.float32), tf.constant(y[s], tf.float32))
    check(chk, "tape", [w.numpy(), b.numpy()], list(numpy_ssgd()))


def graph(chk: Checker, how: str) -> None:
    x, y = rank_data(RANK)
    w0, b0 = initial()
    with tf.Graph().as_default():
        xp = tf.compat.v1.placeholder(tf.float32, [B, FEATURES])
        yp = tf.compat.v1.placeholder(tf.float32, [B, OUTPUTS])
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(w0, tf.float32))
        b = tf.compat.v1.get_variable("b", initializer=tf.constant(b0, tf.float32))
        loss = tf.reduce_mean(tf.square(tf.matmul(xp, w) + b - yp))
        opt = SynchronousSGDOptimizer(tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM), name=how)
        if how == "minimize":
            train_op = opt.minimize(loss)
        else:
            train_op = opt.apply_gradients(opt.compute_gradients(loss))
        with tf.compat.v1.Session(config=_setup.session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for s in range(STEPS):
                sess.run(train_op, {xp: x[s], yp: y[s]})
            got = sess.run([w, b])
    check(chk, how, got, list(numpy_ssgd()))


def main() -> None:
    chk = Checker(RANK)
    scalar(chk)
    tape_keras_variables(chk)
    graph(chk, "compute_apply")
    graph(chk, "minimize")
    chk.done()


if __name__ == "__main__":
    main()
