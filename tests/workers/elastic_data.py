"""Worker for test_elastic_data.py: an elastic job whose samples are counted.

Usage: elastic_data.py LOG_DIR

Started with ``kungfu-run --elastic -np 4``. A tiny linear regression is
trained with an ``ElasticSampler`` over N samples for EPOCHS epochs; each
step sums (not averages) the workers' gradients, so a step's update depends
only on the global batch, not on how it was split. A second variable,
``seen``, counts per sample how often it was trained: its all-reduced
one-hot rows are applied in the same step, so a worker ends with
``seen == EPOCHS`` everywhere only if every sample of every epoch was applied
exactly once.

The script follows the same schedule on every worker (by committed step and
cluster size, elastic_data_plan.py): at step 2 with 4 workers, resize to 2
(ranks 2 and 3 detach); at step 4 with 2 workers, resize to 3 and wait for
the joiner; at step 6 with 3 workers, rank 1 (``ELASTIC_DATA_KILL_RANK``)
takes its ids and SIGKILLs itself (after its launcher, with
``ELASTIC_DATA_KILL_LAUNCHER=1``) before the step's all-reduce (the step
fails on the survivors, who
recover with 2 workers and run it again); at step 8 with 2 workers, resize to
3 again: the launcher's replacement for the killed worker joins. Every
process appends JSON lines to its own file in LOG_DIR:

    {"event": "plan", ...}    ids taken for a step, written before the step runs
    {"event": "commit", ...}  the step at (epoch, offset) succeeded here
    {"event": "kill" | "detached" | "final", ...}

The test rebuilds from these what was trained and checks it against numpy.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import _setup  # noqa: F401  (TF thread limits first)
from _setup import np, ops, tf
from elastic_data_plan import (
    EPOCHS,
    FEATURES,
    GROW_AT,
    KILL_AT,
    LEARNING_RATE,
    SEED,
    SHRINK_AT,
    N,
    batch_size_at,
    dataset,
)

import kungfu_tf
from kungfu_tf import elastic
from kungfu_tf.data import ElasticSampler

# test_config_store.py kills a host instead: rank 0 (alone on its host)
# SIGKILLs its launcher, then itself.
KILL_RANK = int(os.environ.get("ELASTIC_DATA_KILL_RANK", "1"))
KILL_LAUNCHER = os.environ.get("ELASTIC_DATA_KILL_LAUNCHER") == "1"


def main() -> None:
    log_dir = sys.argv[1]
    me = os.environ.get("KUNGFU_SELF", "single")
    # Open for the whole life of the process (closed when it exits or is killed).
    log = open(os.path.join(log_dir, f"{me.replace(':', '_')}-{os.getpid()}.jsonl"), "a", buffering=1)  # noqa: SIM115

    def record(event: str, **fields: object) -> None:
        # One line per write, flushed to the kernel at once: a SIGKILL right
        # after it loses nothing.
        line = {"event": event, "peer": me, "pid": os.getpid(), "time": round(time.time(), 3), **fields}
        log.write(json.dumps(line) + "\n")
        log.flush()

    x_all, y_all = dataset()
    x_table, y_table = tf.constant(x_all), tf.constant(y_all)
    weights = tf.Variable(tf.zeros([FEATURES + 1]), name="weights")  # + bias
    seen = tf.Variable(tf.zeros([N]), name="seen")

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def train_step(ids: tf.Tensor) -> None:
        x, y = tf.gather(x_table, ids), tf.gather(y_table, ids)
        with tf.GradientTape() as tape:
            error = tf.linalg.matvec(x, weights[:FEATURES]) + weights[FEATURES] - y
            loss = 0.5 * tf.reduce_sum(tf.square(error))  # a sum: 0 for an empty share
        gradient = tape.gradient(loss, weights)
        counts = tf.reduce_sum(tf.one_hot(ids, N), axis=0)
        gradient, counts = ops.group_all_reduce([gradient, counts], op="sum", name="elastic_data/step")
        weights.assign_sub(LEARNING_RATE * gradient)
        seen.assign_add(counts)

    sampler = ElasticSampler(N, batch_size=batch_size_at(0), seed=SEED)
    state = elastic.ElasticState([weights, seen], sampler=sampler)

    def warm_up(state: elastic.ElasticState) -> None:
        train_step(tf.zeros([0], tf.int64))  # a joiner, alone: traces the step, changes nothing

    @elastic.run(warm_up=warm_up)
    def train(state: elastic.ElasticState) -> bool:
        """True when training ended here, False when this worker detached."""
        while sampler.epoch < EPOCHS:
            state.check()
            rank, size, step = kungfu_tf.rank(), kungfu_tf.size(), state.step
            if step == SHRINK_AT and size == 4:
                _, detached = ops.resize(2)
                if bool(detached):
                    record("detached", step=step)
                    return False
                continue
            if step in GROW_AT and size == 2:
                ops.resize(3, wait=True)  # joiners warm up, are admitted and get the state
                continue
            epoch, offset = sampler.epoch, sampler.offset
            ids = sampler.next_indices(rank, size, batch_size=batch_size_at(step))
            where = {"step": step, "epoch": epoch, "offset": offset, "size": size, "rank": rank}
            record("plan", ids=ids.tolist(), **where)
            if step == KILL_AT and size == 3 and rank == KILL_RANK:
                record("kill", **where)
                if KILL_LAUNCHER:
                    os.kill(os.getppid(), signal.SIGKILL)  # the host's launcher dies first
                os.kill(os.getpid(), signal.SIGKILL)
            train_step(tf.constant(ids, tf.int64))
            sampler.commit(size)
            state.commit()
            record("commit", **where)
        return True

    if train(state):
        record("final", step=state.step, seen=seen.numpy().tolist(), weights=weights.numpy().tolist())
        counts = seen.numpy()
        if not np.array_equal(counts, np.full(N, EPOCHS, np.float32)):
            print(f"MISMATCH: samples trained {counts.tolist()} times, want {EPOCHS} each", file=sys.stderr)
            sys.exit(1)
        print("checked 1 results", flush=True)


if __name__ == "__main__":
    main()
