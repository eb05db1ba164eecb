"""The main training job: synchronous data-parallel training over kungfu_tf.

Runs alone (one worker) or under the launcher, with any model of
models/registry.py and any of the three TensorFlow APIs:

    kungfu-run -np 4 python models/train.py                       # digits MLP, tf.function loop
    kungfu-run -np 4 python models/train.py --model digits-mlp --api keras --epochs 5
    kungfu-run -np 2 python models/train.py --model resnet20 --api v1 --steps 50

Every worker starts from rank 0's weights (broadcast), trains on its own shard
of each global batch with ``SynchronousSGDOptimizer`` (gradients averaged by
all-reduce), and at the end proves with a consensus check that all workers
hold identical weights. Rank 0 prints loss, throughput and held-out accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from registry import MODELS, ModelSpec

import kungfu_tf
from kungfu_tf import ops
from kungfu_tf.optimizers import (
    PairAveragingOptimizer,
    SynchronousAveragingOptimizer,
    SynchronousSGDOptimizer,
)

APIS = ("function", "keras", "v1")
# S-SGD averages gradients; SMA and pair averaging (AD-PSGD) average models.
WRAPPERS = {
    "sync-sgd": SynchronousSGDOptimizer,
    "sma": SynchronousAveragingOptimizer,
    "pair": PairAveragingOptimizer,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="digits-mlp", choices=sorted(MODELS))
    p.add_argument("--api", default="function", choices=APIS)
    p.add_argument("--optimizer", default="sync-sgd", choices=sorted(WRAPPERS))
    p.add_argument("--batch-size", type=int, default=64, help="per-worker batch size")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, help="training steps (default 400)")
    length.add_argument("--epochs", type=int, help="passes over --samples training samples")
    p.add_argument("--lr", type=float, default=0.002, help="learning rate (Adam; v1: Momentum SGD ×10)")
    p.add_argument("--samples", type=int, default=32768, help="training samples generated per worker")
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads per worker")
    args = p.parse_args(argv)
    if args.batch_size < 1 or (args.steps is not None and args.steps < 1) or (args.epochs is not None and args.epochs < 1):
        p.error("--batch-size, --steps and --epochs must be positive")
    return args


def total_steps(args: argparse.Namespace, size: int) -> int:
    if args.epochs is not None:
        return max(1, args.epochs * args.samples // (args.batch_size * size))
    return args.steps if args.steps is not None else 400


def global_batches(n: int, steps: int, batch: int, size: int, seed: int = 1):
    """Yields (global batch indices, this worker's slice) for every step.

    The generator is seeded identically everywhere, so the workers agree on
    every global batch and each takes its own disjoint shard of it.
    """
    rng = np.random.default_rng(seed)
    rank = kungfu_tf.rank()
    for _ in range(steps):
        idx = rng.choice(n, size=batch * size, replace=n < batch * size)
        yield idx[rank * batch:(rank + 1) * batch]


def take(x, idx):
    return [a[idx] for a in x] if isinstance(x, list) else x[idx]


def train_function(spec: ModelSpec, model: keras.Model, x, y, args: argparse.Namespace, steps: int) -> float:
    """tf.function custom loop calling apply_gradients."""
    optimizer = WRAPPERS[args.optimizer](keras.optimizers.Adam(learning_rate=args.lr))
    loss_fn = spec.loss()
    # Weights first: pair averaging publishes the model when it is built.
    kungfu_tf.broadcast_variables(model.variables, root=0, name="init/weights")
    optimizer.build(model.trainable_variables)
    kungfu_tf.broadcast_variables(list(optimizer.variables), root=0, name="init/optimizer")

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return ops.all_reduce(loss, op="mean", name="loss")

    loss = float("nan")
    for step, mine in enumerate(global_batches(len(y), steps, args.batch_size, kungfu_tf.size()), start=1):
        loss = float(train_step(take(x, mine), y[mine]))
        report(step, steps, loss)
    return loss


def train_keras(spec: ModelSpec, model: keras.Model, x, y, args: argparse.Namespace, steps: int) -> float:
    """model.fit with the Keras callbacks."""
    from kungfu_tf.keras import (
        BroadcastGlobalVariablesCallback,
        MetricAverageCallback,
        verbose,
    )

    model.compile(optimizer=WRAPPERS[args.optimizer](keras.optimizers.Adam(learning_rate=args.lr)), loss=spec.loss())
    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    indices = np.concatenate(list(global_batches(len(y), steps, args.batch_size, size)))
    history = model.fit(
        take(x, indices), y[indices], batch_size=args.batch_size, epochs=1, shuffle=False,
        callbacks=[BroadcastGlobalVariablesCallback(root=0), MetricAverageCallback()],
        verbose=verbose(2) if rank == 0 else 0,
    )
    return float(history.history["loss"][-1])


def train_v1(spec: ModelSpec, args: argparse.Namespace, steps: int, x, y) -> tuple[float, Callable]:
    """tf.compat.v1 graph + MonitoredTrainingSession + SessionRunHook."""
    from kungfu_tf.v1 import BroadcastGlobalVariablesHook

    graph = tf.Graph()
    with graph.as_default():
        model = spec.build()
        inputs = [tf.compat.v1.placeholder(tf.as_dtype(a.dtype), [None, *a.shape[1:]]) for a in
                  (x if isinstance(x, list) else [x])]
        labels = tf.compat.v1.placeholder(tf.as_dtype(y.dtype), [None, *y.shape[1:]])
        loss = spec.loss()(labels, model(inputs if isinstance(x, list) else inputs[0], training=True))
        optimizer = WRAPPERS[args.optimizer](tf.compat.v1.train.MomentumOptimizer(args.lr * 10, momentum=0.9))
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # Keras 3 variables wrap tf.Variables; v1 optimizers want the latter.
        train_op = optimizer.minimize(loss, global_step=global_step,
                                      var_list=[v.value for v in model.trainable_variables])
        mean_loss = ops.all_reduce(loss, op="mean", name="loss")
        value = 0.0
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[BroadcastGlobalVariablesHook(root=0)], log_step_count_steps=None, save_summaries_steps=None,
            save_checkpoint_secs=None,
        ) as sess:
            for step, mine in enumerate(global_batches(len(y), steps, args.batch_size, kungfu_tf.size()), start=1):
                feed = dict(zip(inputs, x_list(take(x, mine))))
                feed[labels] = y[mine]
                value, _ = sess.run([mean_loss, train_op], feed)
                report(step, steps, float(value))
            weights = sess.run([v.value for v in model.weights])
    # Evaluate with an eager copy of the trained model.
    eager_model = spec.build()
    eager_model.set_weights(weights)
    return float(value), eager_model


def x_list(x):
    return x if isinstance(x, list) else [x]


def report(step: int, steps: int, loss: float) -> None:
    if kungfu_tf.rank() == 0 and (step == 1 or step % 50 == 0 or step == steps):
        print(f"step {step:5d}  loss {loss:.4f}", flush=True)


def accuracy(model: keras.Model, x, y) -> float:
    out = model.predict(x, verbose=0, batch_size=256)
    pred = out.argmax(axis=1) if out.ndim == 2 and out.shape[1] > 1 else (out.reshape(-1) > 0.5).astype(y.dtype)
    return float(np.mean(pred == y.reshape(-1)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    spec = MODELS[args.model]
    x, y = spec.data(args.samples, 0)
    x_test, y_test = spec.test_data() if spec.test_data else spec.data(2048, 12345)
    steps = total_steps(args, size)
    # Different seeds per rank: the broadcast must make the workers equal.
    keras.utils.set_random_seed(1000 + rank)

    start = time.perf_counter()
    if args.api == "v1":
        loss, model = train_v1(spec, args, steps, x, y)
    else:
        model = spec.build()
        train = train_function if args.api == "function" else train_keras
        loss = train(spec, model, x, y, args, steps)
    elapsed = time.perf_counter() - start

    flat = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in model.trainable_variables], axis=0)
    same = bool(ops.consensus(flat, name="final-weights"))
    # Only S-SGD keeps replicas identical; model averaging lets them differ.
    must_agree = args.optimizer == "sync-sgd"
    acc = accuracy(model, x_test, y_test)
    if rank == 0:
        print(
            f"model {args.model}  api {args.api}  optimizer {args.optimizer}  workers {size}  steps {steps}  global batch {args.batch_size * size}  "
            f"throughput {steps * args.batch_size * size / elapsed:.0f} samples/s  final loss {loss:.4f}  "
            f"held-out accuracy {acc:.3f}  identical weights on all workers: {same}",
            flush=True,
        )
    return 0 if (same or not must_agree) and np.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
