"""Worker for test_elastic.py: a custom training loop that shrinks, grows and survives a crash.

Usage: elastic_train.py STEPS REFUSE_AT SHRINK_AT GROW_AT KILL_AT VICTIM

A linear model (float64, momentum SGD with its velocity as "optimizer slot"
variables) trains on global batches that depend only on the step: every
global batch has 6 rows and the cluster's workers take equal contiguous
shares, so the averaged gradient, and hence the whole run, is independent of
how many workers there are. The test compares the final weights with a
numpy run of the same updates.

* at step REFUSE_AT (3 workers) the members make bad requests (they
  disagree, a size above --max-np, an unknown worker): each is refused with
  a precise error everywhere and nothing changes;
* at step SHRINK_AT (3 workers) every member calls ``resize(2)`` inside a
  ``tf.function``: the worker of rank 2 is detached and exits 0;
* at step GROW_AT (2 workers) every member calls ``resize(3, wait=True)``:
  the joiner (started by the test as ``KUNGFU_JOINER=1``, already warm and
  ready) is admitted and fetches the state;
* at step KILL_AT the worker at address VICTIM SIGKILLs itself before its
  step (its peers are inside theirs): the survivors recover and finish.

Every worker starts from different weights (seeded by its rank, the joiner
by 99): the first sync must make them rank 0's. Each prints its changes and,
at the end, ``final <step> <samples> <weights...>`` (repr floats).
"""

from __future__ import annotations

import os
import signal
import sys

import _setup
from _setup import np, seed_of, tf

import kungfu_tf
from kungfu_tf import elastic
from kungfu_tf.ops import membership
from kungfu_tf.optimizers.gradient_sync import average_gradients

DIM, BATCH, LR, MOMENTUM = 4, 6, 0.05, 0.9
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0])


def global_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed_of("elastic", step))
    x = rng.normal(size=(BATCH, DIM))
    return x, x @ TRUE_W + 0.1 * rng.normal(size=BATCH)


class SampleCounter:
    """Python state with state_dict/load_state_dict (like a data sampler)."""

    def __init__(self) -> None:
        self.trained = 0

    def state_dict(self) -> dict:
        return {"trained": self.trained}

    def load_state_dict(self, state: dict) -> None:
        self.trained = state["trained"]


def refusals() -> None:
    """Bad requests: the same precise error on every worker, nothing changes."""
    rank = kungfu_tf.rank()
    first = membership.cluster_peers()[0]
    attempts = [
        ("disagreement", lambda: elastic.resize(2 if rank == 0 else 1), elastic.ResizeError),
        ("out of range", lambda: elastic.resize(4), ValueError),
        ("unknown worker", lambda: elastic.resize(workers=[first, "127.0.0.1:1"]), ValueError),
    ]
    for what, call, error in attempts:
        try:
            call()
        except error as e:
            print(f"refused {what}: {' '.join(str(e).split())}", flush=True)
        if kungfu_tf.size() != 3:
            print(f"MISMATCH: {what} changed the cluster", flush=True)
            sys.exit(1)


def main() -> None:
    steps, refuse_at, shrink_at, grow_at, kill_at = (int(a) for a in sys.argv[1:6])
    victim = sys.argv[6]
    me = os.environ["KUNGFU_SELF"]
    joiner = elastic.is_joiner()
    seed = 99 if joiner else _setup.env_rank()
    init = np.random.default_rng(seed).normal(size=DIM)
    w = tf.Variable(init, name="w")
    b = tf.Variable(0.0, dtype=tf.float64, name="b")
    vw = tf.Variable(np.zeros(DIM), name="velocity/w")
    vb = tf.Variable(0.0, dtype=tf.float64, name="velocity/b")
    counter = SampleCounter()
    state = elastic.ElasticState([w, b, vw, vb], counter=counter)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) + b - y))
        gw, gb = tape.gradient(loss, [w, b])
        gw, gb = average_gradients([gw, gb], name="elastic_sgd")
        vw.assign(MOMENTUM * vw - LR * gw)
        vb.assign(MOMENTUM * vb - LR * gb)
        w.assign_add(vw)
        b.assign_add(vb)
        return loss

    def local_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
        x, y = global_batch(step)
        rank, size = kungfu_tf.rank(), kungfu_tf.size()
        rows = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
        return x[rows], y[rows]

    def warm_up(state: elastic.ElasticState) -> None:
        x, y = global_batch(10_000)  # its own batch, alone: traces and runs the step
        train_step(x, y)
        print(f"warm {w.numpy()[0]!r}", flush=True)

    def on_change(change: elastic.Change) -> None:
        print(
            f"change v{change.old_version}->v{change.new_version} size {len(change.new_peers)} "
            f"step {state.step} rank {kungfu_tf.rank()}",
            flush=True,
        )

    state.register_reset_callbacks([on_change])

    @tf.function
    def shrink():
        return elastic.resize(tf.constant(2))

    def train(state: elastic.ElasticState) -> str:
        while state.step < steps:
            state.check()
            size = kungfu_tf.size()
            if state.step == refuse_at and size == 3:
                refusals()
            if state.step == shrink_at and size == 3:
                changed, detached = shrink()  # the symbolic form: a py_function inside a tf.function
                print(f"resize(2) at step {state.step}: changed {bool(changed)} detached {bool(detached)}", flush=True)
                if detached:
                    return "detached"
            if state.step == grow_at and size == 2:
                changed, _ = elastic.resize(3, wait=True)
                print(f"resize(3) at step {state.step}: changed {bool(changed)} size {kungfu_tf.size()}", flush=True)
            if state.step == kill_at and me == victim:
                print(f"killing myself at step {state.step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            train_step(*local_batch(state.step))
            counter.trained += BATCH
            state.commit()
        return "done"

    result = elastic.run(train, warm_up=warm_up)(state)
    if result in (None, "detached"):
        print(f"detached at step {state.step}", flush=True)
        return
    if joiner:
        print(f"joiner finished at step {state.step}", flush=True)
    values = " ".join(repr(float(v)) for v in [*w.numpy(), float(b.numpy())])
    print(f"final {state.step} {counter.trained} {values}", flush=True)


if __name__ == "__main__":
    main()
