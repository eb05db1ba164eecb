"""Worker of KungFu's Listing 1 experiment (benchmarks/listing_one/run.py).

Started through ``python -m kungfu_tf.run``: ``-np 1`` or ``-np 4`` for the
static runs, ``--elastic -np 1 --max-np 4`` for Listing 1. Every worker
builds the same augmented digits set (digits_augmented.py) and trains the
same MLP with ``SynchronousSGDOptimizer`` (SGD with momentum) and a
``GradientMonitor`` (in every run, so that all three pay its cost and report
the gradient noise scale) in a ``tf.function`` step inside
``kungfu_tf.elastic.run``: ``ElasticState(model=, optimizer=, sampler=,
policy=runner)``, an ``ElasticSampler`` that splits each global batch of
``size x --batch`` samples among the workers of the step, and a
``PolicyRunner``:

* ``--mode static``: no policy; the cluster keeps the size it started with;
* ``--mode listing-one``: ``GNSResizePolicy(max_size=--max-size,
  every=--every, unit=--unit)``, by default after every epoch as in
  Listing 1: its rule grows the cluster with the GNS (the launcher starts
  joiners, which warm up alone while the members train, and fetch the
  training state when admitted).

The per-worker batch is fixed (``on_resize="keep_local"``): the global batch
is ``size x --batch``. The learning rate follows one rule in every run,
``lr x sqrt(size)`` (the runner's ``lr_rule="sqrt"`` applies it at each
growth; a static run starts there). Every run trains ``--epochs`` passes.
``--evals-per-epoch`` times per epoch rank 0 stops
its clock, measures the accuracy on the real held-out digits and records it
with the training time so far (evaluation excluded; the first step, which
traces, is not timed), the step, the cluster size, the learning rate and the
GNS. At the end rank 0 prints one ``RESULT {json}`` line with those records,
the size changes it saw and the runner's decisions (each with its step and
training time).
"""

from __future__ import annotations

import argparse
import math
import os
import time

# One thread per worker, before TensorFlow starts: four workers share two cores here.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import numpy as np
import tensorflow as tf

from benchmarks.harness.digits_augmented import augmented_digits
from benchmarks.harness.digits_mlp import build_model
from benchmarks.harness.timing import emit_result

MODES = ("static", "listing-one")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", required=True, choices=MODES)
    p.add_argument("--batch", type=int, default=32, help="per-worker batch size (the global batch is size x this)")
    p.add_argument("--epochs", type=float, default=8.0, help="passes over the augmented training set")
    p.add_argument("--copies", type=int, default=16, help="augmented copies of each training image")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at one worker")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=1024, help="width of the MLP's two hidden layers")
    p.add_argument("--max-size", type=int, default=4, help="listing-one: the policy's largest cluster")
    p.add_argument("--every", type=int, default=1, help="listing-one: the policy checks the GNS every N units")
    p.add_argument("--unit", default="epoch", choices=("step", "epoch"), help="listing-one: of --every")
    p.add_argument("--smoothing", type=float, default=0.99, help="the monitor's EMA decay")
    p.add_argument("--evals-per-epoch", type=int, default=4, help="rank 0 evaluates this many times per epoch")
    p.add_argument("--seed", type=int, default=7)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import kungfu_tf
    from kungfu_tf import elastic
    from kungfu_tf.data import ElasticSampler
    from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
    from kungfu_tf.policy import GNSResizePolicy, PolicyRunner

    keras.utils.set_random_seed(args.seed)
    x, y, x_test, y_test = augmented_digits(args.copies, seed=args.seed)
    # Whole per-worker batches only: no step ever gives a worker an empty share.
    n = len(y) // args.batch * args.batch
    x, y = x[:n], y[:n]
    model = build_model(args.hidden, args.seed)
    size = kungfu_tf.size()
    monitor = GradientMonitor(batch_size=args.batch, smoothing=args.smoothing)
    optimizer = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr * math.sqrt(size), momentum=args.momentum),
                                        monitor=monitor)  # fmt: skip
    listing_one = args.mode == "listing-one"
    policies = [GNSResizePolicy(max_size=args.max_size, every=args.every, unit=args.unit)] if listing_one else []
    runner = PolicyRunner(policies, batch_size=args.batch * size, optimizer=optimizer, lr_rule="sqrt",
                          on_resize="keep_local", verbose=True)  # fmt: skip
    sampler = ElasticSampler(n, args.batch, seed=args.seed)
    state = elastic.ElasticState(model=model, optimizer=optimizer, sampler=sampler, policy=runner)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    spec = (tf.TensorSpec([None, 64], tf.float32), tf.TensorSpec([None], tf.int32))

    @tf.function(input_signature=spec)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def warm_up(state: elastic.ElasticState) -> None:
        train_step(x[: args.batch], y[: args.batch])  # a joiner traces and runs the step alone

    def evaluate() -> float:
        logits = model(x_test, training=False)
        return float(np.mean(np.argmax(logits.numpy(), axis=1) == y_test))

    total = int(args.epochs * n)
    records: list[dict] = []
    sizes: list[dict] = []  # rank 0: every cluster size it trained at, from which step and training time
    decisions: list[dict] = []  # rank 0: the runner's decisions, with the training time they were made at
    clock = [0.0]  # rank 0's training time (evaluation and the first, tracing step excluded)
    eval_every = max(1, n // args.evals_per_epoch)
    next_eval = [0]

    def trained() -> int:
        return sampler.epoch * n + sampler.offset

    def record(rank: int) -> None:
        records.append({"time_s": clock[0], "samples": trained(), "step": state.step, "size": kungfu_tf.size(),
                        "batch_size": runner.batch_size, "learning_rate": runner.learning_rate,
                        "gns": monitor.values()["gns"], "accuracy": evaluate()})  # fmt: skip

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> None:
        runner.before_train()  # again after each membership change, with every member
        seen = state.last_change
        while trained() < total:
            rank, size = kungfu_tf.rank(), kungfu_tf.size()
            if rank == 0:
                if not sizes or sizes[-1]["size"] != size:
                    sizes.append({"size": size, "step": state.step, "time_s": clock[0]})
                if trained() >= next_eval[0]:
                    record(rank)
                    next_eval[0] += eval_every
            ids, epoch = sampler.next_indices(rank, size), sampler.epoch
            t0 = time.perf_counter()
            with runner.step():
                train_step(x[ids], y[ids])
                sampler.commit(size)
                state.commit()
            if sampler.epoch != epoch:
                runner.after_epoch()  # Listing 1's check (unit="epoch")
            if state.step > 1:
                clock[0] += time.perf_counter() - t0
            if rank == 0:
                decisions.extend({"step": d.step, "time_s": clock[0], "text": str(d)}
                                 for d in runner.history[len(decisions):])  # fmt: skip
            t0 = time.perf_counter()
            state.check()  # admits joiners (their state sync is training time too)
            if state.step > 1:
                clock[0] += time.perf_counter() - t0
            if state.last_change is not seen:
                seen = state.last_change
                runner.before_train()
        if kungfu_tf.rank() == 0:
            record(0)
        runner.after_train()

    train(state)
    if kungfu_tf.rank() == 0:
        emit_result({"mode": args.mode, "np": kungfu_tf.size(), "args": vars(args), "records": records,
                     "sizes": sizes, "samples_per_epoch": n,
                     "decisions": decisions})  # fmt: skip


if __name__ == "__main__":
    main()
