"""A custom loop shaped like Horovod's TF2 elastic example, with only the module renamed (``import kungfu_tf as hvd``).

``hvd.elastic.TensorFlowKerasState(model, opt, batch=0, epoch=0, step=0, counter=0, sampler=...)``, a
``tf.function`` step with ``hvd.DistributedGradientTape``, a warm-up step without all-reduce before
``hvd.elastic.run``, a reset callback that sets the learning rate to ``LR * hvd.size()``, a commit every
second step. Data from ``kungfu_tf.data.ElasticSampler`` (a Python value of the state: committed and
rolled back with it).

Events (one JSON line each, ``--record-dir``/<pid>.jsonl):
``enter`` (the function entered: rank, size, values, weights digest), ``trained`` (a step ran, not yet
committed), ``commit`` (values, weights digest, and the steps it commits with their ids, rank, size and
learning rate), ``reset`` (a reset callback: size, learning rate), ``end`` (final values, weights digest;
weights in <pid>.npz).

``--crash-at S --crash-rank R``: the worker of initial rank R kills itself (SIGKILL) as step S begins
(S odd: the step before it is not committed). ``--resize-at S:N,...``: after each commit from step S
on the members call ``hvd.ops.resize(N, wait=True)`` when the cluster is smaller, then
``state.check_host_updates()`` (which raises: the function is entered again from the commit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys

import _setup  # noqa: F401 - threading of a shared 2-core machine
import keras
import numpy as np
import tensorflow as tf

import kungfu_tf as hvd
from kungfu_tf.data import ElasticSampler

SAMPLES, FEATURES, CLASSES, BATCH, LR, SEED = 48, 8, 3, 4, 0.05, 7


def make_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    return rng.normal(size=[SAMPLES, FEATURES]).astype(np.float32), rng.integers(0, CLASSES, SAMPLES).astype(np.int32)


def make_model() -> keras.Model:
    init = keras.initializers.GlorotUniform(seed=SEED)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6, activation="tanh", kernel_initializer=init),
                             keras.layers.Dense(CLASSES, kernel_initializer=init)])  # fmt: skip


def digest(model: keras.Model) -> str:
    return hashlib.sha256(b"".join(np.asarray(w).tobytes() for w in model.get_weights())).hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--crash-at", type=int, default=None)
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--resize-at", default="")
    p.add_argument("--record-dir", required=True)
    args = p.parse_args()
    resizes = {int(s): int(n) for s, n in (part.split(":") for part in args.resize_at.split(",") if part)}
    record_path = os.path.join(args.record_dir, f"{os.getpid()}.jsonl")

    def record(event: str, **fields) -> None:
        with open(record_path, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n")

    joiner = hvd.elastic.is_joiner()
    initial_rank = hvd.rank()
    x, y = make_data()
    mnist_model = make_model()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(LR * hvd.size())

    @tf.function
    def training_step(images, labels, allreduce=True):
        with tf.GradientTape() as tape:
            loss_value = loss(labels, mnist_model(images, training=True))
        if allreduce:
            tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))
        return loss_value

    # As Horovod's example: build the model and the optimizer's state before the state is made.
    initial = mnist_model.get_weights()
    training_step(x[:BATCH], y[:BATCH], allreduce=False)
    mnist_model.set_weights(initial)  # the warm-up step must not move the weights (the test's reference)
    opt.iterations.assign(0)

    sampler = ElasticSampler(SAMPLES, batch_size=BATCH, seed=SEED)
    pending: list[dict] = []  # steps since the last commit

    def values(state) -> dict:
        return {"step": state.step, "batch": state.batch, "epoch": state.epoch, "counter": state.counter,
                "sampler": state.sampler.state_dict(), "weights": digest(mnist_model)}  # fmt: skip

    @hvd.elastic.run
    def train(state):
        pending.clear()  # a rollback dropped them
        record("enter", rank=hvd.rank(), size=hvd.size(), **values(state))
        while state.epoch < args.epochs:
            rank, size = hvd.rank(), hvd.size()
            if state.step == args.crash_at and initial_rank == args.crash_rank and not joiner:
                print(f"rank {rank} crashes at step {state.step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            ids = state.sampler.next_indices(rank, size)
            lr = float(opt.learning_rate.numpy())
            training_step(x[ids], y[ids])
            state.sampler.commit(size)
            pending.append({"step": state.step, "rank": rank, "size": size, "ids": ids.tolist(), "lr": lr,
                            "epoch": state.epoch})  # fmt: skip
            state.step += 1
            state.counter += 10
            state.epoch = state.sampler.epoch
            state.batch = 0 if state.epoch != pending[-1]["epoch"] else state.batch + 1
            record("trained", rank=rank, size=size, **values(state))
            if state.step % 2 == 0 or state.epoch >= args.epochs:
                record("commit", rank=rank, size=size, steps=list(pending), **values(state))
                pending.clear()
                state.commit()
                target = max((n for s, n in resizes.items() if state.step >= s), default=0)
                if hvd.size() < target:
                    hvd.ops.resize(target, wait=True)
                    state.check_host_updates()  # raises: entered again from the commit, with the joiners

    def on_state_reset():
        opt.learning_rate.assign(LR * hvd.size())
        record("reset", rank=hvd.rank(), size=hvd.size(), lr=float(opt.learning_rate.numpy()))

    state = hvd.elastic.TensorFlowKerasState(mnist_model, opt, batch=0, epoch=0, step=0, counter=0, sampler=sampler)
    state.register_reset_callbacks([on_state_reset])
    train(state)

    np.savez(os.path.join(args.record_dir, f"{os.getpid()}.npz"), *mnist_model.get_weights())
    record("end", rank=hvd.rank(), size=hvd.size(), joiner=joiner, **values(state))
    print(f"rank {hvd.rank()} done at step {state.step}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
