"""Adaptive-topology benchmark worker: a fixed number of training steps, each one's time reported.

Started by benchmarks/adaptive_topology/run.py through ``python -m kungfu_tf.run
--topology T`` (one launcher per emulated host). Every worker trains an MLP
on scikit-learn's digits (the hidden widths set the gradient size, and so the
all-reduce traffic) with ``SynchronousSGDOptimizer`` in a ``tf.function``
step, driven by a ``PolicyRunner``: with no policy (the static topology the
job started with) or with ``AdaptiveTopologyPolicy``. After every step rank
0 prints a ``RESULT {json}`` line: the step, its wall-clock start and end
(``time.time()``, the driver's clock: the driver starts and stops the
background traffic by these lines and assigns steps to phases by them), the
runner's step time and throughput, and the topology the step ran with. A
last line lists the runner's decisions.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.harness.timing import emit_result

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


def parse_args() -> argparse.Namespace:
    """Command line (every worker of a run gets the same one)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", required=True, help="label of this run in the results")
    p.add_argument("--adaptive", action="store_true", help="run AdaptiveTopologyPolicy")
    p.add_argument("--steps", type=int, required=True, help="measured steps")
    p.add_argument(
        "--warmup", type=int, default=3, help="steps before the runner starts"
    )
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument("--hidden", default="1024,1024", help="hidden layer widths")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--drop", type=float, default=0.2)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--trial-steps", type=int, default=5)
    p.add_argument("--settle-steps", type=int, default=1)
    return p.parse_args()


def main() -> None:
    """Builds the model and data, then runs ``--warmup`` + ``--steps`` steps."""
    args = parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    import keras

    import kungfu_tf
    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.policy import AdaptiveTopologyPolicy, PolicyRunner

    sys.path.insert(0, str(MODELS_DIR))
    from digits import build_digits_mlp, load_digits_split

    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    if args.batch_size % size:
        raise SystemExit(
            f"--batch-size {args.batch_size} is not a multiple of the {size} workers"
        )
    local = args.batch_size // size
    x, y, _, _ = load_digits_split(test_fraction=0.2, seed=0)
    x, y = x[rank::size], y[rank::size]  # this worker's shard
    batches = [
        (tf.constant(x[i : i + local]), tf.constant(y[i : i + local]))
        for i in range(0, len(x) - local + 1, local)
    ]
    model = build_digits_mlp(hidden=[int(w) for w in args.hidden.split(",")], seed=0)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr))

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    kungfu_tf.broadcast_variables(model.variables, root=0)
    step = 0
    for _ in range(args.warmup):  # tracing and connections: not measured
        float(train_step(*batches[step % len(batches)]))
        step += 1

    policies = []
    if args.adaptive:
        policies.append(
            AdaptiveTopologyPolicy(
                drop=args.drop,
                window=args.window,
                trial_steps=args.trial_steps,
                settle_steps=args.settle_steps,
            )
        )
    runner = PolicyRunner(policies, batch_size=args.batch_size, verbose=True)
    gradient_bytes = 4 * model.count_params()
    with runner.training():
        for i in range(args.steps):
            started = time.time()
            with runner.step():
                topology = runner.topology  # the one this step runs with
                loss = float(train_step(*batches[step % len(batches)]))
            ended = time.time()
            step += 1
            m = runner.context.metrics
            if rank == 0:
                emit_result(
                    {"kind": "step", "run": args.run, "step": i, "start": started, "end": ended,
                     "step_time": m["step_time"], "throughput": m["throughput"], "loss": loss,
                     "topology": topology}
                )  # fmt: skip
    if rank == 0:
        emit_result(
            {"kind": "summary", "run": args.run, "np": size, "batch_size": args.batch_size,
             "gradient_bytes": gradient_bytes, "decisions": [str(d) for d in runner.history]}
        )  # fmt: skip


if __name__ == "__main__":
    main()
