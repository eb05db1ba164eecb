"""Worker for tests/test_gns_listing_one.py: KungFu's Listing 1 end to end, a cluster that grows with the GNS.

Usage: gns_listing_one.py RECORD AFTER EVERY MAX_SIZE

``kungfu-run --elastic -np 1 --max-np MAX_SIZE``: linear regression (tests/workers/gradient_monitor_resize.py's
problem) trained with SGD at a learning rate > 0, so the weights approach the optimum, |G|^2 shrinks and the
gradient noise scale tr(Sigma)/|G|^2 grows step after step. ``SynchronousSGDOptimizer(monitor=
GradientMonitor(...))``, ``PolicyRunner([GNSResizePolicy(max_size=MAX_SIZE, every=EVERY, unit="step")])`` and
``ElasticState(model=, optimizer=, policy=runner)`` in a custom loop inside ``kungfu_tf.elastic.run``; every
member starts the runner again after each membership change (its setup round is a collective), a joiner
after its admission. The job ends AFTER steps after the cluster reached MAX_SIZE (however long the
joiners took to start; steps take at least 20 ms), or fails after LIMIT steps. Each worker appends JSON lines to RECORD: ``{"event": "step", "step", "size", "rank",
"gns", "checksum"}`` per step and ``{"event": "end", ...}``; rank 0 also writes the runner's decisions.
"""

from __future__ import annotations

import json
import os
import sys
import time

import keras
from _setup import np, seed_of, tf

import kungfu_tf
from kungfu_tf import elastic
from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
from kungfu_tf.policy import GNSResizePolicy, PolicyRunner

D, B, SIGMA, LR = 4, 16, 0.5, 0.02
LIMIT, STEP_SECONDS = 5000, 0.02
W_STAR = np.linspace(-1.0, 1.0, D)
W0 = W_STAR + np.array([0.6, 0.8, 0.0, 0.0])


def batch(step: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed_of("listing-one", step, rank))
    x = rng.standard_normal((B, D))
    return x.astype(np.float32), (x @ W_STAR + SIGMA * rng.standard_normal(B)).astype(np.float32)


def main(record: str, after: int, every: int, max_size: int) -> None:
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
    model.layers[0].kernel.assign(W0.reshape(D, 1).astype(np.float32))
    monitor = GradientMonitor(batch_size=B, smoothing=0.9)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(LR), monitor=monitor, name="listing_one_sgd")
    runner = PolicyRunner([GNSResizePolicy(max_size=max_size, every=every, unit="step")], batch_size=B * kungfu_tf.size(),
                          optimizer=opt, verbose=True)  # fmt: skip
    state = elastic.ElasticState(model=model, optimizer=opt, policy=runner, full_since=-1)
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(**fields: object) -> None:
        os.write(fd, (json.dumps(fields) + "\n").encode())

    @tf.function(input_signature=(tf.TensorSpec([None, D], tf.float32), tf.TensorSpec([None], tf.float32)))
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.reshape(model(x), [-1]) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    def warm_up(state: elastic.ElasticState) -> None:
        train_step(*batch(10_000, 0))

    written = [0]

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> bool:
        runner.before_train()
        seen = state.last_change
        while state.full_since < 0 or state.step - state.full_since < after:
            if state.step >= LIMIT:
                raise RuntimeError(f"the cluster did not reach {max_size} workers in {LIMIT} steps")
            rank, size = kungfu_tf.rank(), kungfu_tf.size()
            if size == max_size and state.full_since < 0:
                state.full_since = state.step
            with runner.step():
                started = time.perf_counter()
                train_step(*batch(state.step, rank))
                time.sleep(max(0.0, started + STEP_SECONDS - time.perf_counter()))
                state.commit()
            weights = model.layers[0].kernel.numpy()
            write(event="step", step=state.step - 1, size=size, rank=rank, gns=monitor.values()["gns"],
                  checksum=float(np.sum(weights, dtype=np.float64)))  # fmt: skip
            if kungfu_tf.rank() == 0 or runner.detached:
                for d in runner.history[written[0]:]:
                    if rank == 0:
                        write(event="decision", step=d.step, name=d.name, old=d.old, new=d.new, refused=d.refused)
                written[0] = len(runner.history)
            if runner.detached:
                return True
            state.check()
            if state.last_change is not seen:
                seen = state.last_change
                runner.before_train()  # with every member of the new cluster
        return False

    detached = bool(train(state))
    weights = model.layers[0].kernel.numpy()
    write(event="end", step=state.step, detached=detached, size=None if detached else kungfu_tf.size(),
          weights=[float(w) for w in weights.reshape(-1)])  # fmt: skip
    os.close(fd)
    print(f"finished at step {state.step} with {kungfu_tf.size()} workers (detached: {detached})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
