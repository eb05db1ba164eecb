"""Worker for test_failures.py::test_killed_worker.

Usage: failure_kill.py VICTIM KILL_AFTER

Every rank runs a loop of all-reduces (small ones and ones large enough for
the RING topology under AUTO). Rank VICTIM SIGKILLs itself after KILL_AFTER
steps. The others must fail with UnavailableError (or DeadlineExceededError)
naming the victim; they report

    error <ExceptionClass> after <seconds>s at step <n>: <message>

then try two new all-reduces, which must fail fast as well, reporting

    retry <size> <ExceptionClass> after <seconds>s: <message>

and exit 17 (1.5 s later, so that the launcher has seen the victim die
first and reports it). They ignore SIGTERM so that the launcher's teardown (SIGTERM at
once, SIGKILL 5 s later) does not hide how they fail; a survivor that does
not detect the failure within those 5 s is SIGKILLed and prints nothing.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import _setup
from _setup import Checker, make_input, ops, reduce_ref, tf


def retry(rank: int, size: int) -> None:
    """New collectives after the failure must fail fast too, not wait for the
    timeout: a small one (STAR under AUTO) and a large one (RING)."""
    for n in (100, 50_000):
        t = time.monotonic()
        try:
            ops.all_reduce(tf.ones([n]), name=f"retry/{n}")
        except tf.errors.OpError as e:
            elapsed = time.monotonic() - t
            message = " ".join(str(e.message).split())
            print(f"retry {n} {type(e).__name__} after {elapsed:.3f}s: {message}", flush=True)
        else:
            print(f"retry {n} succeeded without rank 2", flush=True)


def main() -> None:
    victim, kill_after = int(sys.argv[1]), int(sys.argv[2])
    rank, size = _setup.env_rank(), _setup.env_size()
    if rank != victim:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    chk = Checker(rank)
    for step in range(1_000_000):
        if rank == victim and step == kill_after:
            print(f"killing myself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        n = 50_000 if step % 2 else 100  # 200 KB resolves to RING under AUTO, 400 B to STAR
        xs = [make_input(f"kill/{step % 7}", r, (n,), "float32", "small") for r in range(size)]
        t = time.monotonic()
        try:
            got = ops.all_reduce(tf.constant(xs[rank]), name=f"kill/{step}").numpy()
        except tf.errors.OpError as e:
            elapsed = time.monotonic() - t
            message = " ".join(str(e.message).split())
            print(f"error {type(e).__name__} after {elapsed:.3f}s at step {step}: {message}", flush=True)
            retry(rank, size)
            # The job's status must be the victim's, not ours: rather than
            # exit after a pause that a loaded host may outlast before the
            # launcher sees the victim die, wait for the launcher to end us
            # (SIGTERM is ignored: SIGKILL after its grace), so the victim is
            # the only worker that ever ends on its own.
            time.sleep(600)
            sys.exit(17)
        chk.equal(got, reduce_ref(xs, "sum", "float32"), f"step {step}")
    print("the loop ended without an error", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
