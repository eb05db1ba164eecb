"""Worker for test_failures.py::test_timeout (np=2, run with --timeout 3).

Usage: failure_timeout.py DIR

Both ranks do a warm-up all-reduce. Then rank 1 stays away (waiting for a
file) while rank 0 starts all-reduce 'lonely/0', which must fail with
DeadlineExceededError naming rank 1 after about 3 s; then the other way
round ('lonely/1', rank 1 waits for rank 0). Finally both run a normal
all-reduce, which must work. Reports

    timeout <key> after <seconds>s: <message>

and ends with "checked N results".
"""

from __future__ import annotations

import pathlib
import sys
import time

import _setup
from _setup import Checker, make_input, ops, reduce_ref, tf


def wait_for(path: pathlib.Path, limit: float = 60) -> None:
    end = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > end:
            print(f"gave up waiting for {path}", flush=True)
            sys.exit(3)
        time.sleep(0.02)


def lonely(chk: Checker, key: str, other: int) -> None:
    t = time.monotonic()
    try:
        ops.all_reduce(tf.ones([10]), name=key)
    except tf.errors.DeadlineExceededError as e:
        elapsed = time.monotonic() - t
        message = " ".join(str(e.message).split())
        print(f"timeout {key} after {elapsed:.3f}s: {message}", flush=True)
        chk.true(f"rank {other}" in message, f"the error does not name rank {other}: {message}")
        chk.true(key in message, f"the error does not name {key}: {message}")
        return
    except tf.errors.OpError as e:
        chk.fail(f"{key}: expected DeadlineExceededError, got {type(e).__name__}: {e.message}")
    chk.fail(f"{key}: all-reduce with an absent peer succeeded")


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    # --timeout 3 bounds every collective, the first too: the ranks meet (files) before it, however far apart
    # their TensorFlow imports finished on a loaded machine.
    (d / f"rank{rank}_ready").touch()
    wait_for(d / f"rank{1 - rank}_ready")
    chk.equal(ops.all_reduce(tf.ones([3]), name="warmup").numpy(), [size] * 3, "warm-up")
    if rank == 0:
        lonely(chk, "lonely/0", 1)
        (d / "rank0_done").touch()
        wait_for(d / "rank1_done")
    else:
        wait_for(d / "rank0_done")
        lonely(chk, "lonely/1", 0)
        (d / "rank1_done").touch()
    xs = [make_input("after", r, (1001,), "float64", "small") for r in range(size)]
    got = ops.all_reduce(tf.constant(xs[rank]), name="after").numpy()
    chk.equal(got, reduce_ref(xs, "sum", "float64"), "all_reduce after the timeouts")
    chk.done()


if __name__ == "__main__":
    main()
