"""Worker of the adaptive batch-size experiment (benchmarks/adaptive_batch/run.py).

Started through ``python -m kungfu_tf.run -np N``. Every worker builds the
same augmented digits set (digits_augmented.py), takes its shard, and trains
the same MLP from rank 0's initial weights with ``SynchronousSGDOptimizer``
(SGD with momentum) in a ``tf.function`` loop driven by a ``PolicyRunner``:

* ``--mode small`` / ``--mode large``: a static global batch;
* ``--mode adaptive``: starts at the small batch; a ``GradientMonitor`` and
  ``GNSBatchSizePolicy`` grow it with the gradient noise scale;
* ``--mode goodput``: starts at the small batch; ``GoodputBatchSizePolicy``
  moves it to the batch of the highest measured throughput x statistical
  efficiency, between the small and the large batch.

The learning rate follows ``lr(B) = lr * sqrt(B / small_batch)`` in the
first three modes (the large batch starts there; the adaptive run's runner
applies the same square-root rule at every change); the goodput run uses
AdaScale's gain (``lr_rule="adascale"``) from the same monitor.
Every run trains ``--epochs`` epochs, or, with ``--time-budget S``, until
the first evaluation at or past S seconds of training (rank 0's clock,
broadcast at each evaluation so that all workers stop at the same step),
with ``--epochs`` as a cap. Whenever another
``--eval-every`` samples have been trained, rank 0 stops its clock, measures
the accuracy on the real held-out digits and records it with the training
time so far (evaluation excluded), the batch size and the GNS. At the end
rank 0 prints one ``RESULT {json}`` line with those records.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
import tensorflow as tf

from benchmarks.harness.digits_augmented import augmented_digits
from benchmarks.harness.digits_mlp import build_model
from benchmarks.harness.timing import emit_result

MODES = ("small", "large", "adaptive", "goodput")
GRANULARITY = 16  # per-worker batches are multiples of this


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--small-batch", type=int, default=64, help="global batch of 'small' and adaptive's start")
    p.add_argument("--large-batch", type=int, default=1024, help="global batch of 'large' and adaptive's maximum")
    p.add_argument("--epochs", type=float, default=5.0, help="passes over the augmented training set")
    p.add_argument("--copies", type=int, default=16, help="augmented copies of each training image")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at the small batch")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=1024, help="width of the MLP's two hidden layers")
    p.add_argument("--gns-every", type=int, default=20, help="adaptive: the policy checks the GNS every N steps")
    p.add_argument("--gns-threshold", type=float, default=1.5)
    p.add_argument("--eval-every", type=int, default=4096, help="evaluate after every this many samples")
    p.add_argument("--time-budget", type=float, default=0.0, help="stop at the first evaluation past this many "
                   "seconds of training (0: train --epochs)")  # fmt: skip
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    import keras

    import kungfu_tf
    from kungfu_tf import ops
    from kungfu_tf.data import adaptive_batch, shard
    from kungfu_tf.ops import collective
    from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
    from kungfu_tf.policy import (
        GNSBatchSizePolicy,
        GoodputBatchSizePolicy,
        PolicyRunner,
    )

    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    for b in (args.small_batch, args.large_batch):
        if b % (size * GRANULARITY):
            raise SystemExit(f"batch {b} is not a multiple of {size} workers x {GRANULARITY}")
    keras.utils.set_random_seed(args.seed)
    x, y, x_test, y_test = augmented_digits(args.copies, seed=args.seed)
    model = build_model(args.hidden, args.seed)

    batch = args.large_batch if args.mode == "large" else args.small_batch
    lr = args.lr * math.sqrt(batch / args.small_batch)
    adaptive = args.mode in ("adaptive", "goodput")
    monitor = GradientMonitor(batch_size=batch // size) if adaptive else None
    optimizer = SynchronousSGDOptimizer(keras.optimizers.SGD(lr, momentum=args.momentum), monitor=monitor)
    optimizer.build(model.trainable_variables)
    kungfu_tf.broadcast_variables(model.variables, root=0, name="init/weights")
    policies, lr_rule = [], None
    if args.mode == "adaptive":
        policies, lr_rule = [GNSBatchSizePolicy(max_batch_size=args.large_batch, threshold=args.gns_threshold,
                                                every=args.gns_every, round_to=GRANULARITY)], "sqrt"  # fmt: skip
    elif args.mode == "goodput":
        policies, lr_rule = [GoodputBatchSizePolicy(max_batch_size=args.large_batch, min_batch_size=args.small_batch,
                                                    every=args.gns_every, round_to=GRANULARITY)], "adascale"  # fmt: skip
    runner = PolicyRunner(policies, batch_size=batch, optimizer=optimizer, lr_rule=lr_rule, verbose=rank == 0)
    ds = shard(tf.data.Dataset.from_tensor_slices((x, y)))
    ds = ds.shuffle(len(y) // size, seed=args.seed, reshuffle_each_iteration=True).repeat()
    ds = adaptive_batch(ds, runner.local_batch_size, granularity=GRANULARITY)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(input_signature=ds.element_spec)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def evaluate() -> float:
        logits = model(x_test, training=False)
        return float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))

    total = int(args.epochs * len(y))

    def out_of_time(clock: float) -> bool:
        """Rank 0's training clock against the budget, the same answer on every worker."""
        spent = collective.broadcast(tf.constant(clock, tf.float64), root=0, name="bench/time_budget")
        return float(spent.numpy()) >= args.time_budget

    records = []
    batches = iter(ds)
    # One untimed (but counted) step: tracing and connection set-up are not what we compare.
    loss = train_step(*next(batches))
    trained, next_eval, clock = batch, 0, 0.0
    ops.barrier()
    loop_start = time.perf_counter()
    with runner.training():
        while trained < total:
            if trained >= next_eval:
                if rank == 0:
                    metrics = runner.context.metrics
                    records.append({"time_s": clock, "samples": trained, "step": runner.steps_done,
                                    "batch_size": runner.batch_size, "learning_rate": runner.learning_rate,
                                    "gns": metrics.get("gns"), "accuracy": evaluate()})  # fmt: skip
                next_eval += args.eval_every
                if args.time_budget > 0 and out_of_time(clock):
                    break
            this_batch = runner.batch_size  # a change made after the step applies to the next one
            t0 = time.perf_counter()
            with runner.step():
                loss = train_step(*next(batches))
            trained += this_batch
            clock += time.perf_counter() - t0
    if rank == 0:
        if records[-1]["samples"] == trained:
            records.pop()  # stopped by the budget right after an evaluation: this one is the final
        records.append({"time_s": clock, "samples": trained, "step": runner.steps_done, "batch_size": runner.batch_size,
                        "learning_rate": runner.learning_rate, "gns": runner.context.metrics.get("gns"),
                        "accuracy": evaluate()})  # fmt: skip
        emit_result({"mode": args.mode, "np": size, "args": vars(args), "records": records, "train_samples": len(y),
                     "final_loss": float(loss),
                     "loop_wall_s": time.perf_counter() - loop_start, "changes": [str(d) for d in runner.history]})  # fmt: skip


if __name__ == "__main__":
    main()
