"""One worker of the step-completion benchmark: the same PS step traced twice, with and without the wait.

"With" is the strategy compiler as it is: the update waits for one 4-byte
all-reduce that completes on every rank or on none. "Without" is the compiler
before that wait (the update waits for this rank's own averages only), traced
by replacing ``StrategyPlan._completed_everywhere`` while the second step is
traced. Both steps train their own copy of the model on the same batch; timed
blocks alternate between them (A B, B A, ...), so both see the same machine.
Rank 0 prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

import keras

import kungfu_tf
from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import compiler

WITH_WAIT = compiler.StrategyPlan._completed_everywhere


def without_wait(
    plan: Any, synced: dict, must_run: list, prefix: str, payload: tf.Tensor | None = None
) -> tuple[list[Any], None]:
    """The compiler before the wait: this rank's own averages, nothing every rank shares (no clipping by norm,
    whose squared norms ride in the wait's all-reduce: this benchmark's Adam clips nothing)."""
    if payload is not None:
        raise ValueError("the variant without the wait cannot clip by norm")
    return [g.values if isinstance(g, tf.IndexedSlices) else g for g in synced.values()], None


def make_step(strategy: str, hidden: list[int], x: tf.Tensor, y: tf.Tensor, name: str) -> Any:
    keras.utils.set_random_seed(1)
    layers = [keras.layers.Dense(h, activation="relu") for h in hidden] + [keras.layers.Dense(10)]
    model = keras.Sequential([keras.Input((int(x.shape[1]),)), *layers])
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(1e-3), strategy=strategy, name=name)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--strategy", default="PS")
    p.add_argument("--hidden", default="128", help="comma-separated hidden widths")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--rounds", type=int, default=8, help="timed blocks per variant")
    p.add_argument("--steps", type=int, default=100, help="steps per timed block")
    args = p.parse_args()
    hidden = [int(h) for h in args.hidden.split(",")]
    rng = np.random.default_rng(kungfu_tf.rank())
    x = tf.constant(rng.normal(size=(args.batch_size, 64)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, args.batch_size))
    steps = {}
    for label, completion in (("with", WITH_WAIT), ("without", without_wait)):
        compiler.StrategyPlan._completed_everywhere = completion  # type: ignore[method-assign]
        steps[label] = make_step(args.strategy, hidden, x, y, f"completion_{label}")
        steps[label]()  # traced (and its optimizer built) while this variant is in place
    compiler.StrategyPlan._completed_everywhere = WITH_WAIT  # type: ignore[method-assign]
    times: dict[str, list[float]] = {"with": [], "without": []}
    for r in range(args.rounds):
        for label in ("with", "without") if r % 2 == 0 else ("without", "with"):
            for _ in range(5):  # the other variant ran last
                steps[label]()
            started = time.perf_counter()
            for _ in range(args.steps):
                steps[label]()
            times[label].append((time.perf_counter() - started) / args.steps)
    if kungfu_tf.rank() == 0:
        result = {
            "strategy": args.strategy, "hidden": hidden, "np": kungfu_tf.size(),
            "with_s": statistics.median(times["with"]), "without_s": statistics.median(times["without"]),
            "blocks": times,
        }  # fmt: skip
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
