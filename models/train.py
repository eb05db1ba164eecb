"""The main training job: synchronous data-parallel training over kungfu_tf.

Runs alone (one worker) or under the launcher, with any model of
models/registry.py and any of the three TensorFlow APIs:

    kungfu-run -np 4 python models/train.py                       # digits MLP, tf.function loop
    kungfu-run -np 4 python models/train.py --model digits-mlp --api keras --epochs 5
    kungfu-run -np 2 python models/train.py --model resnet20 --api v1 --steps 50
    kungfu-run -np 4 python models/train.py --policy none         # static batch size

Every worker starts from rank 0's weights (broadcast), trains on its own shard
of each global batch with ``SynchronousSGDOptimizer`` (gradients averaged by
all-reduce), and at the end proves with a consensus check that all workers
hold identical weights. Rank 0 prints loss, throughput and held-out accuracy.

By default (``--policy gns``, with ``--optimizer sync-sgd``) the optimizer
carries a ``GradientMonitor`` and a ``GNSBatchSizePolicy`` grows the global
batch whenever the gradient noise scale has grown by ``--gns-threshold``
since the last change (checked every ``--gns-every`` steps, up to
``--max-batch-size``), with the learning rate following the square-root
rule. Rank 0 prints every change with the GNS behind it and writes
TensorBoard scalars (GNS, batch size, learning rate, throughput, ...) to
``--log-dir``. The policy runs for every API: the tf.function loop drives a
``PolicyRunner``, Keras ``fit`` a ``PolicyCallback``, the v1 session a
``PolicyHook``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from registry import MODELS, ModelSpec

import kungfu_tf
from kungfu_tf import ops
from kungfu_tf.data import adaptive_batch, shard
from kungfu_tf.optimizers import (
    GradientMonitor,
    PairAveragingOptimizer,
    SynchronousAveragingOptimizer,
    SynchronousSGDOptimizer,
)
from kungfu_tf.policy import GNSBatchSizePolicy, PolicyRunner

APIS = ("function", "keras", "v1")
POLICIES = ("gns", "none")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each run logs into a directory of its own under this one.
DEFAULT_LOG_ROOT = os.path.join(REPO_ROOT, "build", "demo-logs")
# The learning rate follows batch-size changes by this rule (Adam: square root).
LR_RULE = "sqrt"
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
    length.add_argument("--epochs", type=int, help="passes over --samples training samples (steps counted at the initial batch size)")
    p.add_argument("--lr", type=float, default=0.002, help="learning rate (Adam; v1: Momentum SGD ×10)")
    p.add_argument("--samples", type=int, default=32768, help="training samples generated per worker")
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads per worker")
    p.add_argument("--policy", default="gns", choices=POLICIES,
                   help="gns: GNSBatchSizePolicy adapts the batch size (sync-sgd only); none: static batch")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="largest global batch the policy may choose (default 8x the initial global batch)")
    p.add_argument("--gns-every", type=int, default=25, help="the policy checks the GNS every this many steps")
    p.add_argument("--gns-threshold", type=float, default=1.5,
                   help="the batch grows when the GNS has grown by this factor since the last change")
    p.add_argument("--log-dir", default=None,
                   help=f"TensorBoard log directory (default: a new directory under {DEFAULT_LOG_ROOT}); '' for none")
    args = p.parse_args(argv)
    if args.batch_size < 1 or (args.steps is not None and args.steps < 1) or (args.epochs is not None and args.epochs < 1):
        p.error("--batch-size, --steps and --epochs must be positive")
    if args.gns_every < 1 or not args.gns_threshold > 1 or (args.max_batch_size is not None and args.max_batch_size < 1):
        p.error("--gns-every and --max-batch-size must be positive and --gns-threshold > 1")
    return args


def total_steps(args: argparse.Namespace, size: int) -> int:
    if args.epochs is not None:
        return max(1, args.epochs * args.samples // (args.batch_size * size))
    return args.steps if args.steps is not None else 400


# Per-worker batches are multiples of this (the policy rounds to it;
# adaptive_batch cuts batches from chunks of this many rows).
GRANULARITY = 16


def adaptive(args: argparse.Namespace) -> bool:
    """Whether the batch size adapts: the GNS needs S-SGD's averaged gradients."""
    return args.policy == "gns" and args.optimizer == "sync-sgd"


def make_optimizer(base, args: argparse.Namespace):
    """``base`` wrapped by --optimizer; with a ``GradientMonitor`` when the batch size adapts."""
    if adaptive(args):
        return SynchronousSGDOptimizer(base, monitor=GradientMonitor(batch_size=args.batch_size))
    return WRAPPERS[args.optimizer](base)


def make_policies(args: argparse.Namespace, size: int) -> list[GNSBatchSizePolicy]:
    if not adaptive(args):
        return []
    max_batch = args.max_batch_size or 8 * args.batch_size * size
    return [GNSBatchSizePolicy(max_batch_size=max_batch, threshold=args.gns_threshold, every=args.gns_every,
                               round_to=GRANULARITY)]  # fmt: skip


def runner_args(args: argparse.Namespace, size: int) -> dict:
    """The policy runner's settings (shared by PolicyRunner, PolicyCallback and PolicyHook)."""
    return {
        "batch_size": args.batch_size * size,
        "lr_rule": LR_RULE if adaptive(args) else None,
        "log_dir": args.log_dir or None,
        "verbose": True,
    }


def input_pipeline(x, y, local_batch_size: tf.Variable, seed: int = 1) -> tf.data.Dataset:
    """This worker's shard, reshuffled every pass, in batches of ``local_batch_size`` rows (read per batch)."""
    features = tuple(x) if isinstance(x, list) else x
    ds = shard(tf.data.Dataset.from_tensor_slices((features, y)))
    n = int(ds.cardinality())
    ds = ds.shuffle(min(n, 8192), seed=seed, reshuffle_each_iteration=True).repeat()
    return adaptive_batch(ds, local_batch_size, granularity=GRANULARITY)


class GlobalBatches:
    """This worker's shard of every global batch, for feed_dict training (v1).

    The generator is seeded identically everywhere, so the workers agree on
    every global batch and each takes its own disjoint shard of it; the
    per-worker batch size may change from one call to the next.
    """

    def __init__(self, n: int, seed: int = 1):
        self.n = n
        self.rng = np.random.default_rng(seed)
        self.rank, self.size = kungfu_tf.rank(), kungfu_tf.size()

    def next(self, local_batch: int) -> np.ndarray:
        idx = self.rng.choice(self.n, size=local_batch * self.size, replace=self.n < local_batch * self.size)
        return idx[self.rank * local_batch:(self.rank + 1) * local_batch]


def take(x, idx):
    return [a[idx] for a in x] if isinstance(x, list) else x[idx]


def train_function(spec: ModelSpec, model: keras.Model, x, y, args: argparse.Namespace,
                   steps: int) -> tuple[float, keras.Model, PolicyRunner]:  # fmt: skip
    """tf.function custom loop calling apply_gradients, driven by a ``PolicyRunner``."""
    optimizer = make_optimizer(keras.optimizers.Adam(learning_rate=args.lr), args)
    loss_fn = spec.loss()
    # Weights first: pair averaging publishes the model when it is built.
    kungfu_tf.broadcast_variables(model.variables, root=0, name="init/weights")
    optimizer.build(model.trainable_variables)
    kungfu_tf.broadcast_variables(list(optimizer.variables), root=0, name="init/optimizer")
    size = kungfu_tf.size()
    runner = PolicyRunner(make_policies(args, size), optimizer=optimizer, **runner_args(args, size))
    ds = input_pipeline(x, y, runner.local_batch_size)

    # The batch dimension is None in the signature: one trace for every batch size.
    @tf.function(input_signature=ds.element_spec)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return ops.all_reduce(loss, op="mean", name="loss")

    loss = float("nan")
    batches = iter(ds)
    with runner.training():
        for step in range(1, steps + 1):
            with runner.step():  # policies run after the step; the next batch has the new size
                xb, yb = next(batches)
                loss = float(train_step(xb, yb))
            report(step, steps, loss)
    return loss, model, runner


def train_keras(spec: ModelSpec, model: keras.Model, x, y, args: argparse.Namespace,
                steps: int) -> tuple[float, keras.Model, PolicyRunner]:  # fmt: skip
    """model.fit with the Keras callbacks, the policies in a ``PolicyCallback``."""
    from kungfu_tf.keras import (
        BroadcastGlobalVariablesCallback,
        MetricAverageCallback,
        PolicyCallback,
        verbose,
    )

    model.compile(optimizer=make_optimizer(keras.optimizers.Adam(learning_rate=args.lr), args), loss=spec.loss())
    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    policy = PolicyCallback(make_policies(args, size), **runner_args(args, size))
    history = model.fit(
        input_pipeline(x, y, policy.local_batch_size), steps_per_epoch=steps, epochs=1, shuffle=False,
        callbacks=[BroadcastGlobalVariablesCallback(root=0), policy, MetricAverageCallback()],
        verbose=verbose(2) if rank == 0 else 0,
    )  # fmt: skip
    return float(history.history["loss"][-1]), model, policy.runner


def train_v1(spec: ModelSpec, x, y, args: argparse.Namespace,
             steps: int) -> tuple[float, keras.Model, PolicyRunner]:  # fmt: skip
    """tf.compat.v1 graph + MonitoredTrainingSession + SessionRunHooks (the policies in a ``PolicyHook``)."""
    from kungfu_tf.v1 import BroadcastGlobalVariablesHook, PolicyHook

    size = kungfu_tf.size()
    graph = tf.Graph()
    with graph.as_default():
        model = spec.build()
        inputs = [tf.compat.v1.placeholder(tf.as_dtype(a.dtype), [None, *a.shape[1:]]) for a in
                  (x if isinstance(x, list) else [x])]
        labels = tf.compat.v1.placeholder(tf.as_dtype(y.dtype), [None, *y.shape[1:]])
        loss = spec.loss()(labels, model(inputs if isinstance(x, list) else inputs[0], training=True))
        # A variable, so that the policy's learning-rate rule can change it.
        learning_rate = tf.Variable(args.lr * 10, dtype=tf.float32, trainable=False, name="learning_rate")
        optimizer = make_optimizer(tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum=0.9), args)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        # Keras 3 variables wrap tf.Variables; v1 optimizers want the latter.
        train_op = optimizer.minimize(loss, global_step=global_step,
                                      var_list=[v.value for v in model.trainable_variables])
        mean_loss = ops.all_reduce(loss, op="mean", name="loss")
        policy = PolicyHook(make_policies(args, size), learning_rate=learning_rate,
                            monitor=optimizer.kungfu_monitor if adaptive(args) else None,
                            **runner_args(args, size))  # fmt: skip
        batches = GlobalBatches(len(y))
        value = 0.0
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[BroadcastGlobalVariablesHook(root=0), policy], log_step_count_steps=None,
            save_summaries_steps=None, save_checkpoint_secs=None,
        ) as sess:
            for step in range(1, steps + 1):
                mine = batches.next(policy.current_local_batch_size)
                feed = dict(zip(inputs, x_list(take(x, mine))))
                feed[labels] = y[mine]
                value, _ = sess.run([mean_loss, train_op], feed)
                report(step, steps, float(value))
            weights = sess.run([v.value for v in model.weights])
    # Evaluate with an eager copy of the trained model.
    eager_model = spec.build()
    eager_model.set_weights(weights)
    return float(value), eager_model, policy.runner


def x_list(x):
    return x if isinstance(x, list) else [x]


def report(step: int, steps: int, loss: float) -> None:
    if kungfu_tf.rank() == 0 and (step == 1 or step % 50 == 0 or step == steps):
        print(f"step {step:5d}  loss {loss:.4f}", flush=True)


def accuracy(model: keras.Model, x, y) -> float:
    out = model.predict(x, verbose=0, batch_size=256)
    pred = out.argmax(axis=1) if out.ndim == 2 and out.shape[1] > 1 else (out.reshape(-1) > 0.5).astype(y.dtype)
    return float(np.mean(pred == y.reshape(-1)))


def default_log_dir() -> str:
    return os.path.join(DEFAULT_LOG_ROOT, time.strftime("%Y%m%d-%H%M%S"))


def batch_schedule(runner: PolicyRunner, first: int) -> str:
    """The global batch sizes the run used, with the step each began: "256 (step 0) -> 384 (step 50)"."""
    parts = [f"{first} (step 0)"]
    parts += [f"{d.new} (step {d.step})" for d in runner.history if d.name == "batch_size" and not d.refused]
    return " -> ".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    if args.log_dir is None:
        args.log_dir = default_log_dir()
    spec = MODELS[args.model]
    x, y = spec.data(args.samples, 0)
    x_test, y_test = spec.test_data() if spec.test_data else spec.data(2048, 12345)
    steps = total_steps(args, size)
    # Different seeds per rank: the broadcast must make the workers equal.
    keras.utils.set_random_seed(1000 + rank)
    if rank == 0:
        what = (f"GNSBatchSizePolicy (lr rule {LR_RULE})" if adaptive(args)
                else f"static batch size (--policy {args.policy}, --optimizer {args.optimizer})")  # fmt: skip
        print(f"batch size: {what}; TensorBoard log: {args.log_dir or 'off'}", flush=True)

    start = time.perf_counter()
    if args.api == "v1":
        loss, model, runner = train_v1(spec, x, y, args, steps)
    else:
        train = train_function if args.api == "function" else train_keras
        loss, model, runner = train(spec, spec.build(), x, y, args, steps)
    elapsed = time.perf_counter() - start

    flat = tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in model.trainable_variables], axis=0)
    same = bool(ops.consensus(flat, name="final-weights"))
    # Only S-SGD keeps replicas identical; model averaging lets them differ.
    must_agree = args.optimizer == "sync-sgd"
    acc = accuracy(model, x_test, y_test)
    if rank == 0:
        print(f"global batch size schedule: {batch_schedule(runner, args.batch_size * size)}", flush=True)
        print(
            f"model {args.model}  api {args.api}  optimizer {args.optimizer}  workers {size}  steps {steps}  "
            f"global batch {args.batch_size * size}->{runner.batch_size}  "
            f"throughput {runner.samples / elapsed:.0f} samples/s  final loss {loss:.4f}  "
            f"held-out accuracy {acc:.3f}  identical weights on all workers: {same}",
            flush=True,
        )
    return 0 if (same or not must_agree) and np.isfinite(loss) else 1


if __name__ == "__main__":
    sys.exit(main())
