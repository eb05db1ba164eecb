"""A KungFu elastic script, shaped like KungFu's examples/mnist_elastic_eager, with only the names mapped.

KungFu's ``current_cluster_size``, ``current_rank``, ``detached`` (kungfu.python),
``broadcast_variables`` (kungfu.tensorflow.initializer) and ``all_reduce``,
``resize`` (kungfu.tensorflow.ops) are imported from kungfu_tf under the same
names. No ElasticState: the members ``resize`` on a schedule of steps, and
after ``changed`` every worker broadcasts rank 0's variables and counters (in
``tf.function``s, as KungFu's example does); joiners are plain processes that
run this script from the top and get the state from that broadcast.

The model is linear regression with momentum SGD on a global batch that
depends only on the step: worker r of n takes rows r::n, the gradients are
summed over the workers (each divided by the global batch), so the weights
after any schedule equal one process's (tests/test_kungfu_elastic.py's numpy
reference).

Usage: kungfu_elastic_eager.py STEPS SCHEDULE RECORD_DIR [KILL_TOKEN]
  SCHEDULE: "3:2,6:4,9:3" (after step 3 resize(2), ...)
  KILL_TOKEN: a path; the first joiner that creates it SIGKILLs itself
  before its first collective (the launcher starts another).
Each process writes RECORD_DIR/<pid>.jsonl: start, step, resize and final records.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import _setup  # noqa: F401 - thread limits before TensorFlow starts
import numpy as np
import tensorflow as tf

from kungfu_tf import broadcast_variables, detached
from kungfu_tf import rank as current_rank
from kungfu_tf import size as current_cluster_size
from kungfu_tf.ops import all_reduce, resize

DIM, BATCH, LR, MOMENTUM = 4, 12, 0.05, 0.9
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0])

steps = int(sys.argv[1])
schedule = {int(a): int(b) for a, b in (item.split(":") for item in sys.argv[2].split(",") if item)}
record_path = os.path.join(sys.argv[3], f"{os.getpid()}.jsonl")
kill_token = sys.argv[4] if len(sys.argv) > 4 else ""
joiner = os.environ.get("KUNGFU_JOINER") == "1"


def record(event: str, **fields: object) -> None:
    with open(record_path, "a") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), "joiner": joiner, **fields}) + "\n")


def batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1000 + step)
    x = rng.normal(size=(BATCH, DIM))
    return x, x @ TRUE_W + 0.1 * rng.normal(size=BATCH)


# Every process starts from its own weights: only the broadcast makes them equal.
init = np.random.default_rng(os.getpid()).normal(size=DIM + 1)
w = tf.Variable(init[:DIM], name="w")
b = tf.Variable(init[DIM], name="b")
vw = tf.Variable(np.zeros(DIM), name="vw")
vb = tf.Variable(0.0, dtype=tf.float64, name="vb")
global_step = tf.Variable(0, dtype=tf.int64, name="global_step")
trained_samples = tf.Variable(0, dtype=tf.int64, name="trained_samples")


@tf.function
def sync_model():
    broadcast_variables([w, b])
    broadcast_variables([vw, vb])


@tf.function
def sync_offsets():
    broadcast_variables([global_step, trained_samples])


@tf.function
def training_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(tf.linalg.matvec(x, w) + b - y)) / BATCH
    gw, gb = tape.gradient(loss, [w, b])
    gw, gb = all_reduce(gw), all_reduce(gb)
    vw.assign(MOMENTUM * vw - LR * gw)
    vb.assign(MOMENTUM * vb - LR * gb)
    w.assign_add(vw)
    b.assign_add(vb)


@tf.function
def resize_cluster(new_size):
    return resize(new_size)


if joiner and kill_token:
    try:
        os.close(os.open(kill_token, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        pass  # an earlier joiner took the token and killed itself: this one (its replacement) lives
    else:
        record("killing myself")
        os.kill(os.getpid(), signal.SIGKILL)

# A joiner waits here for its admission (its first question about the cluster).
record("start", rank=current_rank(), size=current_cluster_size())
need_sync = True
while True:
    if need_sync:
        sync_offsets()
        sync_model()
        need_sync = False
    step = int(global_step)
    if step >= steps:
        break
    r, n = current_rank(), current_cluster_size()
    x, y = batch(step)
    training_step(x[r::n], y[r::n])
    global_step.assign_add(1)
    trained_samples.assign_add(BATCH)
    record("step", step=step, rank=r, size=n)
    step = int(global_step)
    if step in schedule:
        changed, detached_ = resize_cluster(schedule[step])
        record("resize", step=step, asked=schedule[step], changed=bool(changed), detached=bool(detached_),
               detached_call=detached(), rank=None if detached() else current_rank(),
               size=None if detached() else current_cluster_size())
        if detached():
            break
        need_sync = bool(changed)

if not detached():
    record("final", step=int(global_step), samples=int(trained_samples), rank=current_rank(),
           weights=[float(v) for v in np.append(w.numpy(), b.numpy())])
