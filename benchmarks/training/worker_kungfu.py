"""Training-throughput benchmark worker for kungfu_tf (S-SGD).

Started by benchmarks/training/run.py through ``python -m kungfu_tf.run -np N``.
Every worker builds the selected model from models/registry.py, takes rank
0's initial weights, and runs a ``tf.function`` training step: forward, loss,
``tape.gradient``, then ``SynchronousSGDOptimizer.apply_gradients`` (which
all-reduce-averages the gradients first). After warm-up steps, rank 0 times
a fixed number of steps and prints one ``RESULT {json}`` line.

The helpers above ``main`` (command line, synthetic batches, timed loop,
result line) are the protocol both training workers share;
benchmarks/training/worker_mwms.py imports them from here, so the two measure exactly
the same way. Nothing at module level imports kungfu_tf.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tensorflow as tf

from benchmarks.harness.timing import emit_result

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

# One (inputs, labels) batch: inputs is a tensor or a list of tensors.
Batch = tuple[Any, tf.Tensor]


def parse_args(description: str) -> argparse.Namespace:
    """Command line of one worker (all workers of a run get the same one)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", required=True, help="a name from models/registry.py")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--pool", type=int, default=4, help="distinct batches per worker")
    p.add_argument("--intra-op", type=int, default=1)
    p.add_argument("--inter-op", type=int, default=2)
    return p.parse_args()


def set_threads(args: argparse.Namespace) -> None:
    """Same TF thread pools for every implementation; must run before any op."""
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)


def load_spec(name: str) -> Any:
    """The registry's ModelSpec for ``name`` (models/ is not a package)."""
    if str(MODELS_DIR) not in sys.path:
        sys.path.insert(0, str(MODELS_DIR))
    from registry import get_model_spec

    return get_model_spec(name)


def _take(inputs: Any, lo: int, hi: int) -> Any:
    """Rows lo:hi of one array or of each array of a multi-input list."""
    if isinstance(inputs, list | tuple):
        return [tf.constant(a[lo:hi]) for a in inputs]
    return tf.constant(inputs[lo:hi])


def make_batches(spec: Any, batch: int, pool: int, seed: int) -> list[Batch]:
    """``pool`` distinct synthetic batches, as tensors, cycled during training.

    Generated up front so that no input pipeline is timed; ``seed`` differs
    per worker so the workers see different data, as in data parallelism.
    """
    x, y = spec.data(batch * pool, seed)
    n = len(y) // batch
    if n < 1:
        raise ValueError(f"{spec.name}: data gave {len(y)} samples < batch {batch}")
    y = np.asarray(y)
    return [
        (
            _take(x, i * batch, (i + 1) * batch),
            tf.constant(y[i * batch : (i + 1) * batch]),
        )
        for i in range(n)
    ]


def timed_training(
    step: Callable[[Any, tf.Tensor], tf.Tensor],
    batches: list[Batch],
    warmup: int,
    steps: int,
    barrier: Callable[[], None],
) -> tuple[float, float]:
    """Runs warm-up then ``steps`` timed steps; returns (seconds, last loss).

    The first warm-up step traces the tf.function and opens connections. A
    barrier lines the workers up before the clock starts; the loss of the
    last step is copied to the host before it stops, so every step has run.
    """
    loss = None
    for i in range(max(1, warmup)):
        loss = step(*batches[i % len(batches)])
    float(loss)
    barrier()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(*batches[i % len(batches)])
    last = float(loss)
    return time.perf_counter() - t0, last


def report(
    impl: str,
    args: argparse.Namespace,
    nworkers: int,
    seconds: float,
    loss: float,
    n_params: int,
) -> None:
    """Rank 0's result line: steps/s and total samples/s over all workers."""
    steps_per_s = args.steps / seconds
    emit_result(
        {
            "impl": impl,
            "model": args.model,
            "np": nworkers,
            "batch_size": args.batch_size,
            "warmup": args.warmup,
            "steps": args.steps,
            "seconds": seconds,
            "steps_per_s": steps_per_s,
            "samples_per_s": steps_per_s * args.batch_size * nworkers,
            "final_loss": loss,
            "loss_finite": math.isfinite(loss),
            "params": n_params,
            "intra_op": args.intra_op,
            "inter_op": args.inter_op,
        }
    )


def main() -> None:
    """Builds, synchronises and times the model on this worker."""
    args = parse_args(__doc__)
    set_threads(args)

    import keras

    import kungfu_tf
    from kungfu_tf import ops as kf
    from kungfu_tf.optimizers import SynchronousSGDOptimizer

    rank, nworkers = kungfu_tf.rank(), kungfu_tf.size()
    spec = load_spec(args.model)
    model = spec.build()
    loss_fn = spec.loss()
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr, momentum=args.momentum))
    opt.build(model.trainable_variables)
    kungfu_tf.broadcast_variables(model.variables, root=0)
    batches = make_batches(spec, args.batch_size, args.pool, seed=1 + rank)

    @tf.function
    def step(x: Any, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    seconds, loss = timed_training(
        step, batches, args.warmup, args.steps, lambda: kf.barrier()
    )
    if rank == 0:
        report("kungfu", args, nworkers, seconds, loss, model.count_params())


if __name__ == "__main__":
    main()
