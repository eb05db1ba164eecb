"""Worker for test_elastic.py: a custom training loop that shrinks, grows and survives a crash.

Usage: elastic_train.py STEPS REFUSE_AT SHRINK_AT GROW_AT KILL_AT VICTIM [GROW_FROM:GROW_TO [BREAK]]

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
* at step GROW_AT (GROW_FROM workers, default 2) every member calls
  ``resize(GROW_TO, wait=True)`` (default 3): a joiner (started by the test
  or the launcher as ``KUNGFU_JOINER=1``) is admitted and fetches the state;
* at step KILL_AT the worker VICTIM (an address, or ``rank:N``: the initial
  member of rank N) SIGKILLs itself before its step (its peers are inside
  theirs): the survivors recover and finish.
* with BREAK=1, the initial member of rank 0 holds step 1 until version 2
  (a joiner the test asked for) is committed; the joiner admitted in
  version 2 asks for one more worker, waits until that one is admitted
  (version 3) and the member listens (it applied version 2), then fails its
  first collective of version 2 (before it connected to anyone in it) as a
  broken handshake with a live peer does (UnavailableError): a failure that
  lost nobody, while the member waits for it in that collective and a
  joiner-only version is already committed.

Every worker starts from different weights (seeded by its rank, the joiner
by 99): the first sync must make them rank 0's. Each prints its changes and,
at the end, ``final <step> <samples> <weights...>`` (repr floats).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import _setup
from _setup import np, seed_of, tf

import kungfu_tf
from kungfu_tf import elastic
from kungfu_tf.elastic.runner import accepts_connections
from kungfu_tf.ops import elastic_membership as em
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
    if os.environ.get("ELASTIC_TEST_LOG"):  # timings of each phase, for debugging
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s.%(msecs)03d %(message)s", datefmt="%H:%M:%S")
    steps, refuse_at, shrink_at, grow_at, kill_at = (int(a) for a in sys.argv[1:6])
    victim = sys.argv[6]
    grow_from, grow_to = (int(n) for n in (sys.argv[7] if len(sys.argv) > 7 else "2:3").split(":"))
    breaks = len(sys.argv) > 8 and sys.argv[8] == "1"
    me = os.environ["KUNGFU_SELF"]
    joiner = elastic.is_joiner()
    is_victim = me == victim or (not joiner and victim == f"rank:{_setup.env_rank()}")
    if breaks and joiner:
        agree = em._agree_wait_target

        def break_first_collective_of_v2(version: int) -> None:
            if version != 2:
                return agree(version)
            em._agree_wait_target = agree  # once
            _, peers = em.current()
            em.config_client().request_size(len(peers) + 1)
            em.wait_newer_than(version, 25.0)
            # As in the job that hung, the member is inside the collective (it applied version 2: its port
            # listens; alone at version 1 it had none, and a peer that never listened looks gone).
            deadline = time.monotonic() + 25.0
            while not accepts_connections(peers[0], duration=0.0) and time.monotonic() < deadline:
                time.sleep(0.05)
            print(f"breaking the first collective of v{version} at v{em.newest_seen()}", flush=True)
            raise tf.errors.UnavailableError(
                None, None, "handshake with rank 0 failed: sending client hello: Broken pipe (injected by the test)"
            )

        em._agree_wait_target = break_first_collective_of_v2
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

    last_commit = [time.monotonic()]

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
            if state.step == grow_at and size == grow_from:
                changed, _ = elastic.resize(grow_to, wait=True)
                print(f"resize({grow_to}) at step {state.step}: changed {bool(changed)} size {kungfu_tf.size()}", flush=True)
            if state.step == kill_at and is_victim:
                print(f"killing myself at step {state.step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if breaks and not joiner and state.step == 1 and em.current()[0] == 1:
                em.wait_newer_than(1, 25.0)  # the others wait in this step's all-reduce meanwhile
            train_step(*local_batch(state.step))
            counter.trained += BATCH
            state.commit()
            now = time.monotonic()
            if state.step > 1 and now - last_commit[0] > 0.3:  # a transition: the idle time (for the report)
                print(f"gap before step {state.step - 1} ended: {now - last_commit[0]:.2f} s", flush=True)
            last_commit[0] = now
        return "done"

    result = elastic.run(train, warm_up=warm_up)(state)
    if result in (None, "detached"):
        # A detached worker lowered its CPU priority (KUNGFU_DETACHED_NICE, default 19).
        print(f"detached at step {state.step} niceness {os.getpriority(os.PRIO_PROCESS, 0)}", flush=True)
        return
    if joiner:
        print(f"joiner finished at step {state.step}", flush=True)
    values = " ".join(repr(float(v)) for v in [*w.numpy(), float(b.numpy())])
    print(f"final {state.step} {counter.trained} {values}", flush=True)


if __name__ == "__main__":
    main()
