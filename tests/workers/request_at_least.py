"""Worker for tests/test_p2p.py::test_request_at_least (np=2, --timeout 3).

Usage: request_at_least.py DIR

Rank 0 saves versions 1..5 of blob 'clock', GAP seconds apart; each holds
[version, time of the save]. Meanwhile rank 1 asks, eagerly, for at least
version 3 (issued before version 3 exists: rank 0 saves it only GAP after
rank 1 said, by a file in DIR, that it is asking), then, inside a tf.function, for
at least version 5. Each answer must be a version >= the one asked for,
hold that version as its value, and have arrived after that version was
saved. Rank 0 then asks itself for at least version 4 (answered at once
with 5).

Then rank 1 asks for version 100, which never comes: DeadlineExceededError
after about the 3 s timeout, naming rank 0, the blob and the version. Rank 0
waits for that without any collective (a file in DIR), so it is not timed
out itself; finally a barrier, and the job must still work.

Reports "got version V after T s" and "timeout after T s: <message>", and
ends with "checked N results".
"""

from __future__ import annotations

import pathlib
import sys
import time

import _setup
from _setup import Checker, np, ops, tf

from kungfu_tf.ops import p2p

GAP = 0.4
VERSIONS = 5
LIKE = tf.zeros([2], tf.float64)


def wait_for(path: pathlib.Path, limit: float = 60) -> None:
    end = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > end:
            print(f"gave up waiting for {path}", flush=True)
            sys.exit(3)
        time.sleep(0.02)


@tf.function
def request_in_function(min_version):
    return p2p.request_at_least(0, "clock", min_version, LIKE)


def check_answer(chk: Checker, value, version, asked: int, where: str) -> float:
    value, version = np.asarray(value), int(version)
    received = time.time()
    print(f"got version {version} for >= {asked} ({where})", flush=True)
    chk.true(version >= asked, f"{where}: version {version} < {asked}")
    chk.equal(value[0], float(version), f"{where}: value holds its version")
    chk.true(received >= value[1], f"{where}: received at {received}, before the save at {value[1]}")
    return received


def saver(chk: Checker, d: pathlib.Path) -> None:
    for v in range(1, VERSIONS + 1):
        if v == 3:  # not before rank 1 asks for it, however late that is on a loaded machine
            wait_for(d / "asking")
        time.sleep(GAP)
        p2p.save("clock", tf.constant([v, time.time()], tf.float64), version=v)
    value, version = p2p.request_at_least(0, "clock", 4, LIKE)  # from ourselves, available at once
    chk.equal(int(version), VERSIONS, "own request: the newest version")
    chk.equal(value.numpy()[0], float(VERSIONS), "own request: value")


def requester(chk: Checker, d: pathlib.Path) -> None:
    asked_at = time.time()
    (d / "asking").touch()
    value, version = p2p.request_at_least(0, "clock", 3, LIKE)
    check_answer(chk, value.numpy(), version.numpy(), 3, "eager")
    # Issued before version 3 (saved GAP after the file): the request must have waited on rank 0.
    chk.true(value.numpy()[1] > asked_at, "the eager request did not wait for version 3")
    value, version = request_in_function(tf.constant(5, tf.int64))
    check_answer(chk, value.numpy(), version.numpy(), 5, "tf.function")


def never_saved(chk: Checker) -> None:
    t = time.monotonic()
    try:
        p2p.request_at_least(0, "clock", 100, LIKE)
    except tf.errors.DeadlineExceededError as e:
        elapsed = time.monotonic() - t
        message = " ".join(e.message.split())
        print(f"timeout after {elapsed:.3f}s: {message}", flush=True)
        for needle in ("'clock'", ">= 100", "rank 0 ("):
            chk.true(needle in message, f"{needle!r} not in: {message}")
        return
    except tf.errors.OpError as e:
        chk.fail(f"expected DeadlineExceededError, got {type(e).__name__}: {e.message}")
    chk.fail("a request for a version never saved succeeded")


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    rank = _setup.env_rank()
    chk = Checker(rank)
    # --timeout 3 bounds every collective, the first too: the ranks meet (files) before it, however far apart
    # their TensorFlow imports finished on a loaded machine.
    (d / f"rank{rank}_ready").touch()
    wait_for(d / f"rank{1 - rank}_ready")
    ops.barrier(name="start")
    if rank == 0:
        saver(chk, d)
        wait_for(d / "rank1_done")
    else:
        requester(chk, d)
        never_saved(chk)
        (d / "rank1_done").touch()
    ops.barrier(name="end")
    chk.done()


if __name__ == "__main__":
    main()
