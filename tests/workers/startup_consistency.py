"""Worker for tests/test_startup_consistency.py: identical starts, averaged logs,
data sharding and rank-0-only side effects.

Usage: startup_consistency.py OUTDIR. Each section checks its own results
(Checker) and the test compares the final ``checked N results`` count.
Every worker starts from different, rank-seeded values, so equality after a
broadcast is never an accident (checked: they differ before, when np > 1).
"""

from __future__ import annotations

import os
import sys

import _setup
import keras
from _setup import Checker, np, ops, seed_of, tf

import kungfu_tf
import kungfu_tf.data
import kungfu_tf.keras as kfk
from kungfu_tf.v1 import BroadcastGlobalVariablesHook

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()


def values_of(label: str, rank: int) -> list[np.ndarray]:
    """Rank ``rank``'s initial values for variables of ``label``: float, int and bool."""
    rng = np.random.default_rng(seed_of(label, rank))
    return [
        rng.standard_normal((3, 4)).astype(np.float32),
        rng.integers(-1000, 1000, (5,)).astype(np.int64),
        rng.integers(0, 2, (6,)).astype(bool),
        np.float64(rng.standard_normal()),
    ]


def gathered(label: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Every rank's copy of each array, stacked along axis 0 (all_gather, not broadcast)."""
    out = []
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        send = a.astype(np.uint8) if a.dtype == bool else a
        out.append(ops.all_gather(tf.constant(send), name=f"gather/{label}/{i}").numpy().astype(a.dtype))
    return out


def all_identical(label: str, arrays: list[np.ndarray]) -> bool:
    """True iff every rank holds byte-identical ``arrays`` (one consensus each)."""
    ok = True
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        a = a.astype(np.uint8) if a.dtype == bool else a
        ok &= bool(ops.consensus(tf.constant(a), name=f"consensus/{label}/{i}").numpy())
    return ok


def check_broadcast_variables(chk: Checker) -> None:
    # Eager, from the last rank.
    root = SIZE - 1
    vs = [tf.Variable(x) for x in values_of("eager", RANK)]
    chk.true(SIZE == 1 or not all_identical("eager/before", [v.numpy() for v in vs]), "eager: inputs already equal")
    result = kungfu_tf.broadcast_variables(vs, root=root)
    chk.true(result is None, f"eager broadcast_variables returned {result!r}")
    for i, (v, want) in enumerate(zip(vs, values_of("eager", root))):
        chk.equal(v.numpy(), want, f"eager broadcast_variables var {i}")
    # Inside tf.function, from rank 0; returns the group op there.
    ws = [tf.Variable(x) for x in values_of("function", RANK)]
    traced: list[object] = []

    @tf.function
    def sync() -> None:
        traced.append(kungfu_tf.broadcast_variables(ws, root=0, name="fn_broadcast"))

    sync()
    chk.true(isinstance(traced[0], tf.Operation), f"tf.function broadcast_variables returned {traced[0]!r}")
    for i, (w, want) in enumerate(zip(ws, values_of("function", 0))):
        chk.equal(w.numpy(), want, f"tf.function broadcast_variables var {i}")
    sync()  # a second run of the same graph reuses its keys
    chk.true(all_identical("function/again", [w.numpy() for w in ws]), "tf.function: second run")
    # Workers whose variables differ (here: shapes) get a clear error everywhere
    # instead of a timeout or one variable copied into another.
    if SIZE > 1:
        odd = [tf.Variable(np.full([3 + RANK], float(RANK), np.float32))]
        try:
            kungfu_tf.broadcast_variables(odd, name="mismatched")
            chk.fail("broadcast_variables accepted different variables on different workers")
        except ValueError as e:
            chk.true("different variables" in str(e) and f"[{3 + RANK}]" in str(e), f"unclear error: {e}")
        chk.equal(odd[0].numpy(), np.full([3 + RANK], float(RANK), np.float32), "mismatch: variable untouched")


def regression_data(seed: object, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed_of("data", seed))
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1)) + 0.1).astype(np.float32)
    return x, y


def build_model(seed: int, optimizer: keras.optimizers.Optimizer, metrics: list[str] | None = None) -> keras.Model:
    init = keras.initializers.GlorotUniform(seed=seed)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu", kernel_initializer=init,
                           bias_initializer=keras.initializers.RandomNormal(seed=seed + 1)),
        keras.layers.BatchNormalization(),  # non-trainable moving statistics too
        keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 2)),
    ])
    model.compile(optimizer=optimizer, loss="mse", metrics=metrics)
    return model


def state(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in list(model.weights) + list(model.optimizer.variables)]


class Snapshot(keras.callbacks.Callback):
    """Records the model and optimizer state at on_train_begin (after earlier callbacks)."""

    def on_train_begin(self, logs=None) -> None:
        self.built = self.model.optimizer.built
        self.values = state(self.model)


def check_keras_broadcast(chk: Checker) -> None:
    x, y = regression_data("shared")  # same batches everywhere: no gradient averaging needed
    # 1. Optimizer built beforehand with rank-dependent momentum slots and step count.
    model = build_model(1000 + RANK, keras.optimizers.SGD(0.05, momentum=0.9))
    model.optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(seed_of("slots", RANK))
    for v in model.optimizer.variables:
        if v.dtype == "int64":
            v.assign(7 * RANK + 3)
        elif tuple(v.shape):
            v.assign(rng.standard_normal(tuple(v.shape)).astype(v.dtype))
    initial = state(model)
    chk.true(SIZE == 1 or not all_identical("keras/before", initial), "keras: initial states already equal")
    root_initial = [g[0] for g in gathered("keras/initial", initial)]
    snap = Snapshot()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[kfk.BroadcastGlobalVariablesCallback(root=0), snap])
    chk.true(len(snap.values) == len(initial) > 10, f"keras: {len(snap.values)} variables snapshotted")
    for i, (got, want) in enumerate(zip(snap.values, root_initial)):
        chk.equal(got, want, f"keras: variable {i} after the broadcast callback is not rank 0's initial value")
    after = state(model)
    chk.true(not np.array_equal(after[0], root_initial[0]), "keras: training did not change the weights")
    chk.equal(int(model.optimizer.iterations.numpy()), 3 + 8, "keras: iterations (rank 0's 3 + 8 steps)")
    chk.true(all_identical("keras/after", after), "keras: states differ across ranks after momentum training")

    # 2. Optimizer not built yet: the callback builds it and broadcasts its slots.
    model = build_model(2000 + RANK, keras.optimizers.Adam(0.01))
    snap = Snapshot()
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
              callbacks=[kfk.BroadcastGlobalVariablesCallback(), snap])
    chk.true(snap.built, "keras: optimizer not built at on_train_begin")
    chk.true(all_identical("keras/adam/start", snap.values), "keras/adam: start states differ")
    chk.true(all_identical("keras/adam/after", state(model)), "keras/adam: states differ after training")


class LogRecorder(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.epochs: list[dict[str, float]] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.epochs.append(dict(logs))


def check_metric_average(chk: Checker) -> None:
    x, y = regression_data(("mine", RANK))  # different data per rank: different metrics
    xv, yv = regression_data(("val", RANK), n=32)
    model = build_model(3000, keras.optimizers.SGD(0.01), metrics=["mae"])
    raw, averaged = LogRecorder(), LogRecorder()
    model.fit(x, y, batch_size=32, epochs=2, verbose=0, validation_data=(xv, yv),
              callbacks=[raw, kfk.MetricAverageCallback(), averaged])
    for epoch in range(2):
        keys = sorted(raw.epochs[epoch])
        chk.true({"loss", "mae", "val_loss", "val_mae"} <= set(keys), f"metric average: logs {keys}")
        mine = np.array([raw.epochs[epoch][k] for k in keys], np.float64)
        everyone = gathered(f"metrics/{epoch}", [mine])[0]
        chk.true(SIZE == 1 or not np.array_equal(everyone[0], everyone[1]), "metric average: raw logs equal")
        got = np.array([averaged.epochs[epoch][k] for k in keys])
        chk.close(got, everyone.mean(axis=0), 1e-12, f"metric average epoch {epoch}")
        chk.true(all_identical(f"metrics/avg/{epoch}", [got]), "metric average: averaged logs differ")
        history = np.array([model.history.history[k][epoch] for k in keys])
        chk.equal(history, got, "metric average: History did not see the averaged logs")


def check_shard(chk: Checker) -> None:
    n = 101
    mine = list(kungfu_tf.data.shard(tf.data.Dataset.range(n)).as_numpy_iterator())
    kept = n - n % SIZE  # every worker drops the last n % SIZE alike, so shards are even
    chk.equal(np.array(mine), np.arange(RANK, kept, SIZE), "shard: this rank's elements")
    member = np.zeros(n, np.int32)
    member[mine] = 1
    chk.equal(gathered("shard", [member])[0].sum(axis=0), (np.arange(n) < kept).astype(np.int32),
              "shard: disjoint, even, and all but the remainder")


def check_rank_zero(chk: Checker, outdir: str) -> None:
    chk.equal(kfk.verbose(), 1 if RANK == 0 else 0, "verbose()")
    chk.equal(kfk.verbose(2), 2 if RANK == 0 else 0, "verbose(2)")
    path = os.path.join(outdir, f"ckpt-rank{RANK}.weights.h5")
    x, y = regression_data("shared")
    model = build_model(5000, keras.optimizers.SGD(0.01))
    ckpt = kfk.RankZeroOnly(keras.callbacks.ModelCheckpoint(path, save_weights_only=True))
    print("progress bars start", flush=True)
    model.fit(x, y, batch_size=32, epochs=1, verbose=kfk.verbose(), callbacks=[ckpt])
    print("progress bars end", flush=True)
    chk.equal(os.path.exists(path), RANK == 0, "RankZeroOnly: checkpoint file exists")


def check_v1_hook(chk: Checker) -> None:
    root = SIZE - 1
    with tf.Graph().as_default():
        init = values_of("v1", RANK)
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(init[0]))
        counter = tf.compat.v1.get_variable("counter", initializer=tf.constant(init[1]))
        step = tf.compat.v1.train.get_or_create_global_step()
        x = tf.constant(np.ones((2, 3), np.float32))
        loss = tf.reduce_sum(tf.square(tf.matmul(x, w)))
        opt = tf.compat.v1.train.MomentumOptimizer(0.01, momentum=0.9)
        train_op = opt.minimize(loss, global_step=step)
        slot = opt.get_slot(w, "momentum")
        hook = BroadcastGlobalVariablesHook(root=root)
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[hook], config=_setup.session_config(), log_step_count_steps=None, save_summaries_steps=None
        ) as sess:
            start = sess.run([w, counter])
            for _ in range(3):
                sess.run(train_op)
            end = sess.run([w, counter, slot, step])
    want = values_of("v1", root)
    chk.equal(start[0], want[0], "v1 hook: w is root's")
    chk.equal(start[1], want[1], "v1 hook: counter is root's")
    chk.equal(int(end[3]), 3, "v1 hook: global step")
    chk.true(all_identical("v1/after", end), "v1 hook: variables differ after training")


def main() -> None:
    outdir = sys.argv[1]
    chk = Checker(RANK)
    for section in (check_broadcast_variables, check_keras_broadcast, check_metric_average, check_shard,
                    check_v1_hook):
        section(chk)
        print(f"{section.__name__} done, {chk.count} checks", flush=True)
    check_rank_zero(chk, outdir)
    chk.done()


if __name__ == "__main__":
    main()
