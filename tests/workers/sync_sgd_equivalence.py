"""Worker for tests/test_sync_sgd.py: SynchronousSGDOptimizer == one process on the union.

Usage: sync_sgd_equivalence.py NP

Every worker holds per-worker batch B of each global batch (rows
[r*B, (r+1)*B) of it) and starts from identical weights (drawn from a fixed
seed). After STEPS steps with SGD + momentum wrapped in
SynchronousSGDOptimizer, its weights and momentum slots must equal those of a
plain optimizer trained *in this same process* (no collectives) with batch
NP*B on the whole global batch. Rank 0 trains that reference and compares;
a consensus shows that every other worker holds exactly rank 0's state.
Checked for:

* keras: Model.fit with a learning-rate schedule (default fusion threshold);
* function: a tf.function loop calling apply_gradients (tiny fusion
  threshold: several buckets);
* v1: tf.compat.v1 graph, MomentumOptimizer, MonitoredTrainingSession
  (fusion disabled: one all-reduce per gradient);
* sparse: an Embedding model whose gradient is tf.IndexedSlices, with
  sparse_as_dense False and True;
* direct: average_gradients on IndexedSlices whose number of slices differs
  per rank, against numpy.

Tolerance: rtol 1e-5, atol 1e-6 (float32; the only difference from the
reference is the summation order of the per-example gradients).
Ends with "checked N results"; N is expected_checks() in test_sync_sgd.py.
"""

from __future__ import annotations

import sys
import time

import _setup
import keras
from _setup import Checker, np, ops, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer, average_gradients

STEPS = 6
B = 4  # per-worker batch
FEATURES, HIDDEN, OUTPUTS = 5, 7, 3
VOCAB, DIM, TOKENS = 16, 4, 3
LR, MOMENTUM = 0.1, 0.9
RTOL, ATOL = 1e-5, 1e-6


def close(chk: Checker, got, want, what: str) -> None:
    got_a, want_a = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got_a.shape != want_a.shape:
        chk.fail(what, f"shape {got_a.shape} != expected {want_a.shape}")
    if not np.allclose(got_a, want_a, rtol=RTOL, atol=ATOL):
        err = np.max(np.abs(got_a - want_a))
        chk.fail(what, f"max abs difference {err}\ngot  {got_a.reshape(-1)[:6]}\nwant {want_a.reshape(-1)[:6]}")
    chk.count += 1


def compare(chk: Checker, rank: int, got: list, reference, what: str) -> None:
    """Every rank: same state as all others (consensus). Rank 0: equal to ``reference()``.

    Only rank 0 trains the single-process reference: on 2 cores, NP copies of
    it would only slow the job down, and the consensus extends rank 0's
    verdict to every worker.
    """
    flat = np.concatenate([np.asarray(g, np.float64).reshape(-1) for g in got])
    chk.true(bool(ops.consensus(tf.constant(flat), name=f"agree/{what}").numpy()), f"{what}: workers differ")
    if rank == 0:
        close_all(chk, got, reference(), what)


def close_all(chk: Checker, got: list, want: list, what: str) -> None:
    if len(got) != len(want):
        chk.fail(what, f"{len(got)} arrays, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        close(chk, g, w, f"{what}[{i}]")


def dense_data(size: int) -> tuple[np.ndarray, np.ndarray]:
    """STEPS global batches of size*B rows, identical on every worker."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(STEPS * size * B, FEATURES)).astype(np.float32)
    y = rng.normal(size=(STEPS * size * B, OUTPUTS)).astype(np.float32)
    return x, y


def shard(a: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This worker's rows: B rows of every global batch, disjoint across workers."""
    return a.reshape(STEPS, size, B, *a.shape[1:])[:, rank].reshape(STEPS * B, *a.shape[1:])


def initial_weights(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """Same fixed seed on every worker and for every reference: identical starts."""
    rng = np.random.default_rng(3)
    return [(0.5 * rng.normal(size=s)).astype(np.float32) for s in shapes]


def dense_model() -> keras.Model:
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="tanh"), keras.layers.Dense(OUTPUTS)]
    )
    model.set_weights(initial_weights([tuple(w.shape) for w in model.weights]))
    return model


def sgd(schedule: bool = False) -> keras.optimizers.SGD:
    lr = keras.optimizers.schedules.ExponentialDecay(LR, decay_steps=2, decay_rate=0.5) if schedule else LR
    return keras.optimizers.SGD(lr, momentum=MOMENTUM)


def slots(opt: keras.optimizers.Optimizer) -> list[np.ndarray]:
    """The momentum slots (and iteration count): they must match as well."""
    return [v.numpy() for v in opt.variables]


def run_keras(chk: Checker, rank: int, size: int) -> None:
    x, y = dense_data(size)

    def fit(opt, xs, ys, batch):
        model = dense_model()
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
        model.fit(xs, ys, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        return model

    opt = SynchronousSGDOptimizer(sgd(schedule=True))
    model = fit(opt, shard(x, rank, size), shard(y, rank, size), B)

    def reference() -> list[np.ndarray]:
        ref_opt = sgd(schedule=True)
        return fit(ref_opt, x, y, size * B).get_weights() + slots(ref_opt)

    chk.true(int(opt.iterations.numpy()) == STEPS, f"keras: {int(opt.iterations.numpy())} iterations")
    compare(chk, rank, model.get_weights() + slots(opt), reference, "keras weights+slots")


def run_function(chk: Checker, rank: int, size: int) -> None:
    x, y = dense_data(size)
    loss_fn = keras.losses.MeanSquaredError()

    def train(opt, xs, ys, batch):
        model = dense_model()

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        for s in range(STEPS):
            step(xs[s * batch : (s + 1) * batch], ys[s * batch : (s + 1) * batch])
        return model

    # 64 bytes: the 35-float kernel and 7-float bias of the first layer do not
    # fit together, so this runs several buckets (and one oversized gradient).
    opt = SynchronousSGDOptimizer(sgd(), fusion_threshold_bytes=64, name="custom_loop")
    model = train(opt, shard(x, rank, size), shard(y, rank, size), B)

    def reference() -> list[np.ndarray]:
        ref_opt = sgd()
        return train(ref_opt, x, y, size * B).get_weights() + slots(ref_opt)

    compare(chk, rank, model.get_weights() + slots(opt), reference, "function weights+slots")


def run_v1(chk: Checker, rank: int, size: int) -> None:
    x, y = dense_data(size)
    shapes = [(FEATURES, HIDDEN), (HIDDEN,), (HIDDEN, OUTPUTS), (OUTPUTS,)]

    def train(wrap: bool, xs, ys, batch) -> list[np.ndarray]:
        with tf.Graph().as_default():
            xp = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
            yp = tf.compat.v1.placeholder(tf.float32, [None, OUTPUTS])
            w1, b1, w2, b2 = [
                tf.compat.v1.get_variable(f"w{i}", initializer=tf.constant(v))
                for i, v in enumerate(initial_weights(shapes))
            ]
            pred = tf.matmul(tf.tanh(tf.matmul(xp, w1) + b1), w2) + b2
            loss = tf.reduce_mean(tf.square(pred - yp))
            opt = tf.compat.v1.train.MomentumOptimizer(LR, MOMENTUM)
            if wrap:
                opt = SynchronousSGDOptimizer(opt, fusion_threshold_bytes=0)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train_op = opt.minimize(loss, global_step=global_step)
            variables = [w1, b1, w2, b2]
            fetch = variables + [opt.get_slot(v, "momentum") for v in variables] + [global_step]
            with tf.compat.v1.train.MonitoredTrainingSession(config=_setup.session_config()) as sess:
                for s in range(STEPS):
                    sl = slice(s * batch, (s + 1) * batch)
                    sess.run(train_op, {xp: xs[sl], yp: ys[sl]})
                return sess.run(fetch)

    got = train(True, shard(x, rank, size), shard(y, rank, size), B)
    chk.true(int(got[-1]) == STEPS, f"v1: global step {got[-1]}")
    compare(chk, rank, got[:-1], lambda: train(False, x, y, size * B)[:-1], "v1 weights+slots")


def run_sparse(chk: Checker, rank: int, size: int, sparse_as_dense: bool) -> None:
    rng = np.random.default_rng(11)
    ids = rng.integers(0, VOCAB, size=(STEPS * size * B, TOKENS)).astype(np.int32)
    y = rng.normal(size=(STEPS * size * B, 1)).astype(np.float32)
    loss_fn = keras.losses.MeanSquaredError()
    seen_sparse: list[bool] = []

    def train(opt, xs, ys, batch):
        model = keras.Sequential(
            [keras.Input((TOKENS,), dtype="int32"), keras.layers.Embedding(VOCAB, DIM),
             keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)]
        )
        model.set_weights(initial_weights([tuple(w.shape) for w in model.weights]))

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            seen_sparse.append(isinstance(grads[0], tf.IndexedSlices))  # at trace time
            opt.apply_gradients(zip(grads, model.trainable_variables))

        for s in range(STEPS):
            step(xs[s * batch : (s + 1) * batch], ys[s * batch : (s + 1) * batch])
        return model

    what = f"sparse(sparse_as_dense={sparse_as_dense})"
    opt = SynchronousSGDOptimizer(sgd(), sparse_as_dense=sparse_as_dense, name=f"sparse{int(sparse_as_dense)}")
    model = train(opt, shard(ids, rank, size), shard(y, rank, size), B)
    chk.true(bool(seen_sparse) and all(seen_sparse), f"{what}: embedding gradient is not IndexedSlices")

    def reference() -> list[np.ndarray]:
        ref_opt = sgd()
        return train(ref_opt, ids, y, size * B).get_weights() + slots(ref_opt)

    compare(chk, rank, model.get_weights() + slots(opt), reference, f"{what} weights+slots")


def run_direct(chk: Checker, rank: int, size: int) -> None:
    """average_gradients itself, eager: uneven IndexedSlices, None, dense, mixed dtypes."""

    def slices(r: int) -> tuple[np.ndarray, np.ndarray]:
        n = r + 1  # a different number of slices on every rank
        rng = np.random.default_rng(100 + r)
        return rng.integers(0, 9, n).astype(np.int64), rng.normal(size=(n, 2)).astype(np.float32)

    def dense(r: int) -> list[np.ndarray]:
        rng = np.random.default_rng(200 + r)
        return [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(5,)).astype(np.float64)]

    idx, val = slices(rank)
    d32, d64 = dense(rank)
    grads = [tf.constant(d32), None, tf.IndexedSlices(tf.constant(val), tf.constant(idx), tf.constant([9, 2])),
             tf.constant(d64)]
    for threshold in (0, 48, 1 << 20):
        out = average_gradients(grads, fusion_threshold_bytes=threshold, name=f"direct{threshold}")
        chk.true(out[1] is None, "direct: None stays None")
        chk.true(isinstance(out[2], tf.IndexedSlices), "direct: IndexedSlices stays IndexedSlices")
        all_idx = np.concatenate([slices(r)[0] for r in range(size)])
        all_val = np.concatenate([slices(r)[1] for r in range(size)]) / size
        chk.equal(out[2].indices.numpy(), all_idx, f"direct/{threshold}: gathered indices in rank order")
        close(chk, out[2].values.numpy(), all_val, f"direct/{threshold}: gathered values / size")
        chk.equal(out[2].dense_shape.numpy(), np.array([9, 2]), f"direct/{threshold}: dense_shape")
        close(chk, out[0].numpy(), np.mean([dense(r)[0] for r in range(size)], axis=0), f"direct/{threshold}: f32")
        close(chk, out[3].numpy(), np.mean([dense(r)[1] for r in range(size)], axis=0), f"direct/{threshold}: f64")
        chk.true(out[3].dtype == tf.float64, "direct: dtype kept")


def main() -> None:
    size = int(sys.argv[1])
    rank = _setup.env_rank()
    chk = Checker(rank)
    t0 = time.monotonic()
    parts = [
        ("direct", lambda: run_direct(chk, rank, size)),
        ("keras", lambda: run_keras(chk, rank, size)),
        ("function", lambda: run_function(chk, rank, size)),
        ("v1", lambda: run_v1(chk, rank, size)),
        ("sparse", lambda: run_sparse(chk, rank, size, sparse_as_dense=False)),
        ("sparse_as_dense", lambda: run_sparse(chk, rank, size, sparse_as_dense=True)),
    ]
    for label, fn in parts:
        fn()
        print(f"{label} done at {time.monotonic() - t0:.1f}s, {chk.count} checks", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
