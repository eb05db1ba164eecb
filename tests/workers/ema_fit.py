"""Worker for test_moving_average_weights.py (``kungfu-run -np 2``): Keras ``fit`` with ``use_ema=True`` under PS.

A 64-16-10 MLP compiled with ``SynchronousSGDOptimizer(SGD(0.1, momentum=0.9,
use_ema=True, ...), strategy=STRATEGY)`` is fit for one epoch on this rank's
share of a generated data set (no shuffle). When training ends Keras's ``fit``
calls ``finalize_variable_values``: the model's weights become their moving
averages, which under parameter servers only the owners hold. It raised a
shape mismatch on one rank and gave the other rank another variable's
average. Both ranks' final weights must equal one process's ``fit`` with the
same optimizer on the union batches (each step: both ranks' batches).

Usage: ``ema_fit.py STRATEGY [OVERWRITE_EVERY|-] [adafactor]`` (``adafactor``: Keras's
Adafactor, whose slots are not all of their variables' shapes, instead of SGD), or
``ema_fit.py refused`` (Adafactor under PartitionedPS, whose shards' factored slots
cannot be gathered into their variables': refused on every rank). Ends with "checked N results".
"""

from __future__ import annotations

import sys

import keras
from _setup import Checker, env_rank, np

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.errors import StrategyError

BATCH, STEPS = 8, 6


def data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(rank)
    x = rng.standard_normal((BATCH * STEPS, 64)).astype(np.float32)
    y = rng.integers(0, 10, BATCH * STEPS)
    return x, y


def model() -> keras.Model:
    keras.utils.set_random_seed(3)
    net = keras.Sequential([keras.Input((64,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(10)])
    return net


def sgd(overwrite_every: int | None, name: str = "sgd") -> keras.optimizers.Optimizer:
    if name == "adafactor":
        return keras.optimizers.Adafactor(0.01, epsilon_1=1e-8, use_ema=True, ema_momentum=0.8,
                                          ema_overwrite_frequency=overwrite_every)  # fmt: skip
    return keras.optimizers.SGD(0.1, momentum=0.9, use_ema=True, ema_momentum=0.8,
                                ema_overwrite_frequency=overwrite_every)  # fmt: skip


def partitioned(strategy: str) -> object:
    # PartitionedPS cuts the 64x16 kernel (4 KB) in two shards, one per rank.
    return builders.PartitionedPS(min_partition_bytes=64) if strategy == "PartitionedPS" else strategy


def refused() -> None:
    """Adafactor (a shard's factored slots are not a cut of its variable's) with use_ema under PartitionedPS: fit
    trains, and its end raises the same StrategyError on both ranks (one collective agrees on the refusal: a
    rank that raised alone would leave the other waiting in the gather for ever)."""
    check = Checker(env_rank())
    net = model()
    opt = keras.optimizers.Adafactor(0.01, epsilon_1=1e-8, use_ema=True)
    net.compile(optimizer=SynchronousSGDOptimizer(opt, strategy=partitioned("PartitionedPS")),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))  # fmt: skip
    x, y = data(env_rank())
    try:
        net.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        check.true(False, "fit's end refuses Adafactor's averages")
    except StrategyError as e:
        check.true("cannot move the optimizer slots of Adafactor" in str(e), str(e))
    check.done()


def main() -> None:
    if sys.argv[1] == "refused":
        return refused()
    strategy = sys.argv[1]
    overwrite_every = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
    name = sys.argv[3] if len(sys.argv) > 3 else "sgd"
    rank = env_rank()
    check = Checker(rank)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    net = model()
    net.compile(optimizer=SynchronousSGDOptimizer(sgd(overwrite_every, name), strategy=partitioned(strategy)),
                loss=loss)  # fmt: skip
    x, y = data(rank)
    net.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

    # One process: each step's batch is both ranks' batches of that step (the mean loss over it is the
    # mean of the two ranks' mean losses: the gradient the workers average).
    (x0, y0), (x1, y1) = data(0), data(1)
    xu = np.concatenate([np.concatenate([x0[s * BATCH:(s + 1) * BATCH], x1[s * BATCH:(s + 1) * BATCH]])
                         for s in range(STEPS)])  # fmt: skip
    yu = np.concatenate([np.concatenate([y0[s * BATCH:(s + 1) * BATCH], y1[s * BATCH:(s + 1) * BATCH]])
                         for s in range(STEPS)])  # fmt: skip
    reference = model()
    reference.compile(optimizer=sgd(overwrite_every, name), loss=loss)
    reference.fit(xu, yu, batch_size=2 * BATCH, epochs=1, shuffle=False, verbose=0)
    untrained = model()
    for got, want, start in zip(net.trainable_weights, reference.trainable_weights, untrained.trainable_weights):
        check.true(not np.allclose(want.numpy(), start.numpy()), f"{got.path}: the reference trained")
        check.close(got.numpy(), want.numpy(), 1e-5, f"{strategy}: {got.path} after fit (moving averages)")
    check.done()


if __name__ == "__main__":
    main()
