"""Worker for tests/test_strategy_training.py: sparse PS traffic scales with touched rows.

Usage: strategy_sparse_bytes.py   (np = 2; rank 0 owns the embedding table)

An embedding table of ROWS x DIM trained with plain SGD under the PS
strategy, synchronous, stale-synchronous (K = 1) and asynchronous: each step
touches at most BATCH*TOKENS rows per worker. The bytes rank 1 sends plus
receives per step (runtime counters) must stay far below the table's size,
and must not grow when the table is 4x larger. The first step, whose fetch
brings the whole table on the stale paths, is not measured. Prints the
measured bytes per step as JSON.
"""

from __future__ import annotations

import json

import _setup
import keras
from _setup import Checker, np, ops, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders

DIM, BATCH, TOKENS, STEPS = 16, 4, 3, 5


MODES = {"sync": builders.PS(owner=0), "ssp": builders.PS(owner=0, staleness=1), "async": builders.PS(owner=0, sync=False)}


def bytes_per_step(mode: str, rows: int, rank: int) -> float:
    keras.backend.clear_session()
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((TOKENS,), dtype="int32"), keras.layers.Embedding(rows, DIM), keras.layers.Flatten(), keras.layers.Dense(1)]
    )
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=MODES[mode], name=f"{mode}{rows}")
    rng = np.random.default_rng(rank)
    ids = rng.integers(0, rows, (STEPS + 1, BATCH, TOKENS)).astype(np.int32)
    y = rng.normal(size=(STEPS + 1, BATCH, 1)).astype(np.float32)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

    step(ids[0], y[0])  # trace first
    ops.barrier(name=f"{mode}{rows}/start")
    sent0, recv0 = (t.numpy().sum() for t in ops.comm_bytes())
    for s in range(1, STEPS + 1):
        step(ids[s], y[s])
    sent1, recv1 = (t.numpy().sum() for t in ops.comm_bytes())
    ops.barrier(name=f"{mode}{rows}/end")
    return float(sent1 - sent0 + recv1 - recv0) / STEPS


def main() -> None:
    rank = _setup.env_rank()
    chk = Checker(rank)
    table = 20_000 * DIM * 4
    report = {}
    for mode in MODES:
        small, large = bytes_per_step(mode, 20_000, rank), bytes_per_step(mode, 80_000, rank)
        if rank == 1:
            chk.true(small < 0.05 * table, f"{mode}: {small:.0f} B/step is not far below the {table} B table")
            chk.true(large < 1.5 * small, f"{mode}: 4x table: {large:.0f} B/step vs {small:.0f} B/step")
            report[mode] = {"20000_rows": small, "80000_rows": large}
    if rank == 1:
        print(json.dumps({"bytes_per_step": report, "table_bytes": table}), flush=True)
    chk.done()


if __name__ == "__main__":
    main()
