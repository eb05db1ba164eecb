"""Keras ``fit`` shaped like Horovod's Keras elastic example, with only the module renamed (``import kungfu_tf as hvd``).

``model.compile(optimizer=SynchronousSGDOptimizer(...))`` (Horovod's ``hvd.DistributedOptimizer``), a one-step
``fit`` before the state is made, ``hvd.elastic.KerasState(model, batch=0, epoch=0, trained=0)``, a reset
callback that sets the learning rate to ``LR * hvd.size()`` and runs Horovod's one-step ``fit``, the
callbacks ``UpdateEpochStateCallback``, ``UpdateBatchStateCallback``, ``CommitStateCallback(state, 2)``, and
``fit(dataset, steps_per_epoch=STEPS // hvd.size(), epochs=EPOCHS - state.epoch)`` inside ``hvd.elastic.run``.

Events (JSON lines in ``--record-dir``/<pid>.jsonl): ``enter``, ``trained`` (a batch ended, before its
commit), ``commit`` (what ``state.commit()`` saves), ``reset`` (size, learning rate, and the values and
weights the change left, before the reset's own step), ``end``.

``--crash-at T --crash-rank R``: the worker of initial rank R kills itself (SIGKILL) as the batch begins
at which ``state.trained == T`` (T odd: the batch before is not committed). ``--resize-at T:N,...``: after
the first commit at ``state.trained >= T`` the members call ``hvd.ops.resize(N, wait=True)`` when the
cluster is smaller, then ``state.check_host_updates()``.
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
from kungfu_tf.optimizers import SynchronousSGDOptimizer

SAMPLES, FEATURES, CLASSES, BATCH, LR, STEPS, SEED = 64, 8, 3, 4, 0.02, 12, 11


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
            f.write(json.dumps({"event": event, "pid": os.getpid(), "rank": hvd.rank(), "size": hvd.size(), **fields}) + "\n")

    joiner = hvd.elastic.is_joiner()
    initial_rank = hvd.rank()
    rng = np.random.default_rng(SEED)
    x, y = rng.normal(size=[SAMPLES, FEATURES]).astype(np.float32), rng.integers(0, CLASSES, SAMPLES).astype(np.int32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(BATCH)

    init = keras.initializers.GlorotUniform(seed=SEED)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6, activation="tanh", kernel_initializer=init),
                              keras.layers.Dense(CLASSES, kernel_initializer=init)])  # fmt: skip
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(LR * hvd.size(), momentum=0.9))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt)
    model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)  # Horovod: initialize the optimizer's state

    state = hvd.elastic.KerasState(model, batch=0, epoch=0, trained=0)

    def values() -> dict:
        return {"epoch": state.epoch, "batch": state.batch, "trained": state.trained, "weights": digest(model)}

    commit = state.commit
    committed_at = [-1]  # state.trained at the last commit

    def recorded_commit() -> None:
        record("commit", **values())
        committed_at[0] = state.trained
        commit()

    state.commit = recorded_commit  # what each commit saved, for the test

    def on_state_reset():
        record("reset", lr=LR * hvd.size(), **values())
        state.model.optimizer.learning_rate.assign(LR * hvd.size())
        state.model.fit(dataset, steps_per_epoch=1, epochs=1, verbose=0)  # Horovod's re-initializing step

    state.register_reset_callbacks([on_state_reset])

    class Trained(keras.callbacks.Callback):
        """Counts batches in the state (a value rolled back with it); the crash."""

        def on_train_batch_begin(self, batch, logs=None):
            if state.trained == args.crash_at and initial_rank == args.crash_rank and not joiner:
                print(f"rank {hvd.rank()} crashes at trained={state.trained}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, batch, logs=None):
            state.trained += 1
            record("trained", **values())

    class Grow(keras.callbacks.Callback):
        """After the commit: the scheduled resize, then the interrupt that makes every member re-enter fit."""

        def on_train_batch_end(self, batch, logs=None):
            if committed_at[0] != state.trained:
                return
            target = max((n for t, n in resizes.items() if state.trained >= t), default=0)
            if hvd.size() < target:
                hvd.ops.resize(target, wait=True)
                state.check_host_updates()

    callbacks = [
        hvd.elastic.UpdateEpochStateCallback(state),
        hvd.elastic.UpdateBatchStateCallback(state),
        Trained(),
        hvd.elastic.CommitStateCallback(state, batches_per_commit=2),
        Grow(),
    ]

    @hvd.elastic.run
    def train(state):
        record("enter", **values())
        state.model.fit(dataset, steps_per_epoch=STEPS // hvd.size(), epochs=args.epochs - state.epoch,
                        callbacks=callbacks, verbose=0)  # fmt: skip

    train(state)
    record("end", joiner=joiner, **values())
    print(f"rank {hvd.rank()} done: epoch {state.epoch}, {state.trained} batches", flush=True)


if __name__ == "__main__":
    sys.exit(main())
