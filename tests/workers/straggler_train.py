"""A custom elastic loop with a ``StragglerPolicy``: one slowed worker gets replaced.

    kungfu-run --elastic -np 2 --max-np 3 python straggler_train.py RECORD_DIR SLOW_SECONDS SLOW_RANK EVERY MAX_STEPS

The worker of initial rank SLOW_RANK (not a joiner) is slow by construction:
its forward pass waits SLOW_SECONDS (a ``tf.py_function`` sleep) before the
gradients exist, so its compute time, as the ``GradientMonitor`` measures it
(from the step's start to its gradients), is that much longer than its
peers' on an idle and on a loaded machine alike (a CPU quota made the
verdict depend on how much CPU the fast worker got). Every worker
trains a small MLP on synthetic data (batch 512 per worker, one TF thread)
inside ``kungfu_tf.elastic.run`` with ``ElasticState(policy=runner)``, and
writes ``RECORD_DIR/<host_port>-<pid>.jsonl``: one line per step (step,
rank, size, peers, compute_time, worker_compute_times), one at the end
(detached, the decision log) and its final weights to ``.npz``. It stops
after the policy reports the straggler gone (and ``EVERY`` more steps), or
after MAX_STEPS.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import keras
import numpy as np
import tensorflow as tf

import kungfu_tf
from kungfu_tf import elastic
from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
from kungfu_tf.policy import PolicyRunner, StragglerPolicy

BATCH, FEATURES, HIDDEN, ROWS = 512, 512, 256, 4096


def main(record_dir: str, slow_seconds: float, slow_rank: int, every: int, max_steps: int) -> None:
    me = os.environ["KUNGFU_SELF"]
    joiner = elastic.is_joiner()
    out = open(os.path.join(record_dir, f"{me.replace(':', '_')}-{os.getpid()}.jsonl"), "a", buffering=1)  # noqa: SIM115
    straggler = not joiner and kungfu_tf.rank() == slow_rank
    if straggler:
        print(f"straggler {me} waits {slow_seconds} s in every forward pass", flush=True)

    def pause() -> np.float32:
        time.sleep(slow_seconds)
        return np.float32(0.0)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    y = rng.integers(0, 10, ROWS).astype(np.int32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(10)])  # fmt: skip
    monitor = GradientMonitor(batch_size=BATCH, gns=False)
    optimizer = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01), monitor=monitor)
    optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    policy = StragglerPolicy(every=every, warmup_steps=2)
    runner = PolicyRunner([policy], batch_size=BATCH * kungfu_tf.size(), monitor=monitor, verbose=True)

    @tf.function(input_signature=(tf.TensorSpec([None, FEATURES], tf.float32), tf.TensorSpec([None], tf.int32)))
    def train_step(xb, yb):
        if straggler:  # the forward pass waits for the pause, so the gradients do too
            xb = xb + tf.ensure_shape(tf.py_function(pause, [], tf.float32), [])
        with tf.GradientTape() as tape:
            loss = loss_object(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    state = elastic.ElasticState(lambda: model.variables + list(optimizer.variables), policy=runner)
    started = [False]

    def start_runner() -> None:
        if not started[0]:
            # Members: together before the first step (one round). A joiner: after the sync, without a round
            # (the members keep training and never start again); before_train in its warm-up ran alone, at
            # size 1, with a batch_size built for the cluster it was joining, and was refused.
            if joiner:
                runner.join_running()
            else:
                runner.before_train()
            started[0] = True

    def warm_up(state: elastic.ElasticState) -> None:
        train_step(x[:BATCH], y[:BATCH])

    def batch(step: int, rank: int, size: int) -> np.ndarray:
        return ((step * size + rank) * BATCH + np.arange(BATCH)) % ROWS

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> bool:
        start_runner()
        while state.step < max_steps and policy.state_dict()["replaced"] == 0:
            rank, size, peers = kungfu_tf.rank(), kungfu_tf.size(), list(runner.peers)  # the step's cluster
            ids = batch(state.step, rank, size)
            t0 = time.time()
            with runner.step():
                train_step(x[ids], y[ids])
                values = monitor.values()
            out.write(json.dumps({"event": "step", "step": state.step, "rank": rank, "size": size,
                                  "peers": peers, "t0": t0, "t1": time.time(),
                                  "compute_time": values["compute_time"],
                                  "worker_compute_times": list(values["worker_compute_times"])}) + "\n")  # fmt: skip
            state.commit()
            if runner.detached:
                return True
            state.check()
        return False

    detached = bool(train(state))
    weights = [w.numpy() for w in model.trainable_weights]
    np.savez(out.name[: -len(".jsonl")] + ".npz", *weights)
    out.write(json.dumps({"event": "end", "step": state.step, "detached": detached, "joiner": joiner,
                          "log_lines": runner.log_lines, "policy": policy.state_dict()}) + "\n")  # fmt: skip
    out.close()
    print(f"{me} finished at step {state.step} (detached: {detached})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
