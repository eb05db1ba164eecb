"""The main training job: synchronous data-parallel SGD over kungfu_tf.

Runs alone (one worker) or under the launcher:

    kungfu-run -np 4 python models/train.py --steps 400

Every worker starts from rank 0's weights (broadcast), trains on its own shard
of each global batch, averages gradients with one fused all-reduce per step,
and at the end proves with a consensus check that all workers hold identical
weights. Rank 0 prints loss, accuracy and throughput.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from mlp import build_mlp
from synthetic_data import teacher_dataset

import kungfu_tf
from kungfu_tf import ops


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--samples", type=int, default=32768)
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads per worker")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size = kungfu_tf.rank(), kungfu_tf.size()

    x, y = teacher_dataset(args.samples, args.features, args.classes, seed=0)
    split = int(0.9 * len(x))
    x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

    # Different seeds per rank: the broadcast below must make them equal.
    model = build_mlp(args.features, args.classes, seed=1000 + rank)
    optimizer = tf.keras.optimizers.Adam(learning_rate=args.lr)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer.build(model.trainable_variables)
    for v in model.variables + list(optimizer.variables):
        v.assign(ops.broadcast(v, root=0, name=f"init/{v.path}"))

    @tf.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        grads = ops.group_all_reduce(grads, op="mean", name="gradients")
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return ops.all_reduce(loss, op="mean", name="loss")

    rng = np.random.default_rng(1)  # same on every worker: they agree on each global batch
    global_batch = args.batch_size * size
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        idx = rng.choice(len(x_train), size=global_batch, replace=False)
        mine = idx[rank * args.batch_size:(rank + 1) * args.batch_size]
        loss = train_step(x_train[mine], y_train[mine])
        if rank == 0 and (step % 50 == 0 or step == 1):
            print(f"step {step:5d}  loss {float(loss):.4f}", flush=True)
    elapsed = time.perf_counter() - start

    accuracy = float(np.mean(model.predict(x_test, verbose=0).argmax(axis=1) == y_test))
    flat = tf.concat([tf.reshape(v, [-1]) for v in model.trainable_variables], axis=0)
    same = bool(ops.consensus(flat, name="final-weights"))
    if rank == 0:
        print(f"workers {size}  steps {args.steps}  global batch {global_batch}  "
              f"throughput {args.steps * global_batch / elapsed:.0f} samples/s  "
              f"test accuracy {accuracy:.3f}  identical weights on all workers: {same}", flush=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
