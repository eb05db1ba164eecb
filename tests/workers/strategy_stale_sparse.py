"""Worker for tests/test_strategy_training.py: stale and asynchronous PS with sparse gradients.

Usage: strategy_stale_sparse.py   (np = 3; rank 0 owns every variable, except
in the partitioned run, where the table's row shards have different owners)

An embedding table and a dense layer under ``PS(staleness=1)`` and
``PS(sync=False)``, as Keras layers in a ``tf.function`` and as a
``tf.compat.v1`` graph run by ``MonitoredTrainingSession``. The loss is linear in both, so each gradient is a fixed
function of the worker's batch (embedding: the vector C at every looked-up
row; dense: the column sums of the inputs), whatever weights the worker
holds. With plain SGD the owner's final values are therefore known exactly,
however stale each step was: the initial values minus lr / size times the
sum of every gradient every worker pushed. numpy computes that from the
inputs of all workers.

After the training steps the workers meet at a barrier (every push has
arrived at the owner by then) and run two steps on empty batches: in the
first the owner applies what it has not taken yet, in the second everybody
fetches the result. Then every worker must hold the reference values:
the table, whose rows travel only as changed rows, and the dense kernel.
Rank 1 also sleeps in some steps so that the owner runs ahead of it.
"""

from __future__ import annotations

import time

import _setup
import keras
from _setup import Checker, np, ops, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders

ROWS, DIM, FEATURES, BATCH, TOKENS, STEPS, LR = 500, 4, 3, 4, 5, 8, 0.05
C = np.linspace(0.5, 2.0, DIM).astype(np.float32)


def batches(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + rank)
    ids = rng.integers(0, ROWS, (STEPS, BATCH, TOKENS)).astype(np.int32)
    x = rng.normal(size=(STEPS, BATCH, FEATURES)).astype(np.float32)
    return ids, x


def reference(table0: np.ndarray, kernel0: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    table, kernel = table0.astype(np.float64), kernel0.astype(np.float64)
    for r in range(size):
        ids, x = batches(r)
        np.add.at(table, ids.reshape(-1), -LR / size * C.astype(np.float64))
        kernel -= LR / size * x.astype(np.float64).sum(axis=(0, 1))[:, None]
    return table, kernel


def drive(mode: str, rank: int, step, barrier) -> None:
    """Training steps (rank 1 sometimes slow), then the two flush steps on empty batches."""
    ids, x = batches(rank)
    for s in range(STEPS):
        if rank == 1 and s % 3 == 1:
            time.sleep(0.2)  # the owner runs ahead (as far as the mode allows)
        step(ids[s], x[s])
    barrier(f"{mode}/trained")
    no_ids, no_x = np.zeros((0, TOKENS), np.int32), np.zeros((0, FEATURES), np.float32)
    step(no_ids, no_x)  # the owner applies the pushes it has not taken yet
    barrier(f"{mode}/flushed")
    step(no_ids, no_x)  # everybody fetches the final values


def check(mode: str, size: int, chk: Checker, initial: list[np.ndarray], final: list[np.ndarray]) -> None:
    want_table, want_kernel = reference(initial[0], initial[1], size)
    chk.true(np.abs(want_table - initial[0]).max() > 0.01, f"{mode}: the reference moves the table")
    chk.close(final[0], want_table.astype(np.float32), 1e-5, f"{mode}: embedding table")
    chk.close(final[1], want_kernel.astype(np.float32), 1e-5, f"{mode}: dense kernel")


def run_keras(mode: str, strategy, rank: int, size: int, chk: Checker) -> None:
    """Keras layers, a tf.function step."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(5)
    emb = keras.layers.Embedding(ROWS, DIM)
    dense = keras.layers.Dense(1, use_bias=False)
    emb.build((None, TOKENS))
    dense.build((None, FEATURES))
    variables = [emb.embeddings, dense.kernel]
    initial = [v.numpy().copy() for v in variables]
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(LR), strategy=strategy, name=mode)
    c = tf.constant(C)

    @tf.function
    def step(ids, x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(emb(ids) * c) + tf.reduce_sum(dense(x))
        grads = tape.gradient(loss, variables)
        opt.apply_gradients(zip(grads, variables))

    drive(mode, rank, step, lambda name: ops.barrier(name=name))
    check(mode, size, chk, initial, [v.numpy() for v in variables])
    ops.barrier(name=f"{mode}/checked")


def run_v1(mode: str, strategy, rank: int, size: int, chk: Checker) -> None:
    """tf.compat.v1: a graph, GradientDescentOptimizer, MonitoredTrainingSession."""
    rng = np.random.default_rng(7)
    initial = [rng.normal(size=(ROWS, DIM)).astype(np.float32), rng.normal(size=(FEATURES, 1)).astype(np.float32)]
    with tf.Graph().as_default():
        ids_p = tf.compat.v1.placeholder(tf.int32, [None, TOKENS])
        x_p = tf.compat.v1.placeholder(tf.float32, [None, FEATURES])
        table, kernel = [tf.compat.v1.get_variable(n, initializer=tf.constant(v)) for n, v in zip(["emb", "k"], initial)]
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, ids_p) * C) + tf.reduce_sum(tf.matmul(x_p, kernel))
        opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(LR), strategy=strategy, name=mode)
        train_op = opt.minimize(loss)
        barriers = {name: ops.barrier(name=name) for name in (f"{mode}/trained", f"{mode}/flushed")}
        with tf.compat.v1.train.MonitoredTrainingSession(config=_setup.session_config()) as sess:
            drive(mode, rank, lambda i, x: sess.run(train_op, {ids_p: i, x_p: x}), lambda n: sess.run(barriers[n]))
            final = sess.run([table, kernel])
    check(mode, size, chk, initial, final)
    ops.barrier(name=f"{mode}/checked")


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    run_keras("ssp", builders.PS(owner=0, staleness=1), rank, size, chk)
    run_keras("async", builders.PS(owner=0, sync=False), rank, size, chk)
    # The table cut into row shards owned by different ranks: every rank owns
    # some rows and fetches the others' (shard offsets undone on the way back).
    run_keras("partitioned-ssp", builders.PartitionedPS(min_partition_bytes=1024, staleness=1), rank, size, chk)
    run_v1("v1-ssp", builders.PS(owner=0, staleness=1), rank, size, chk)
    run_v1("v1-async", builders.PS(owner=0, sync=False), rank, size, chk)
    chk.done()


if __name__ == "__main__":
    main()
