"""Worker for tests/test_state_sync.py (np=3, --timeout 8). Usage: state_sync.py DIR

Ranks 0 and 1 hold the same state (variables of several dtypes, ~10 MiB:
three 4 MiB pieces, two of which cross variable boundaries); rank 2 holds
zeros.

1. Ranks 0 and 1 save it as sources 0 and 1 of 2; rank 2 fetches it from
   both. Every rank's digest must equal the layout's XXH3-128 computed by
   state_digest_reference.py (numpy and the system's libxxhash), and rank 2's variables the seeded values.
2. Rank 0 saves other values under another name, rank 1 saves nothing:
   rank 2's fetch must fail with DeadlineExceededError naming rank 1, and its
   variables keep every value of step 1 (the pieces from rank 0 arrived, but
   the variables take nothing from an incomplete fetch).
3. Rank 2 fetches the step-1 pieces into a model whose last variable is
   shorter: InvalidArgumentError naming the byte counts; variables unchanged.

While rank 2 waits out the timeout, ranks 0 and 1 wait for a file it
writes in DIR, not in a collective (which would time out too).

Ends with "checked N results".
"""

from __future__ import annotations

import pathlib
import sys
import time

import _setup
from _setup import Checker, np, ops, tf
from state_digest_reference import reference_digest

from kungfu_tf.ops import state_sync

SHAPES = [("float32", (1500, 1000)), ("bool", (3,)), ("int64", (5,)), ("bfloat16", (1_000_001,)), ("float64", (300_001,))]


def values(scale: float) -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    out = []
    for dtype, shape in SHAPES:
        v = rng.normal(size=shape) * scale
        out.append((v > 0) if dtype == "bool" else v.astype(_setup.np_dtype(dtype)))
    return out


def wait_for(path: pathlib.Path, limit: float = 120) -> None:
    end = time.monotonic() + limit
    while not path.exists():
        if time.monotonic() > end:
            print(f"gave up waiting for {path}", flush=True)
            sys.exit(3)
        time.sleep(0.02)


def main() -> None:
    done = pathlib.Path(sys.argv[1]) / "rank2-done"
    rank = _setup.env_rank()
    chk = Checker(rank)
    want = values(1.0)
    variables = [tf.Variable(v if rank < 2 else np.zeros_like(v)) for v in want]

    # 1. two sources, one receiver
    if rank < 2:
        digest = state_sync.save_state(variables, "test/state", version=7, source=rank, sources=2)
    else:
        digest = state_sync.fetch_state(variables, [0, 1], "test/state", min_version=5)
    chk.equal(bytes(digest.numpy()), reference_digest(want), "digest against numpy + libxxhash")
    digests = ops.all_gather(digest).numpy()
    chk.true(all((d == digests[0]).all() for d in digests), "every rank's digest is the same")
    for i, (v, w) in enumerate(zip(variables, want)):
        chk.equal(v.numpy(), w, f"variable {i} after the fetch")
    ops.barrier()

    # 2. a source that never saves: nothing changes on the receiver
    if rank == 0:
        state_sync.save_state([tf.Variable(v) for v in values(2.0)], "test/other", version=1, source=0, sources=2)
    if rank == 2:
        try:
            state_sync.fetch_state(variables, [0, 1], "test/other", min_version=1)
            chk.fail("the fetch from a source that saved nothing succeeded")
        except tf.errors.DeadlineExceededError as e:
            print(f"incomplete: {e.message}", flush=True)
            chk.true("test/other/1" in e.message and "rank 1" in e.message, f"the error names piece and source: {e}")
        for i, (v, w) in enumerate(zip(variables, want)):
            chk.equal(v.numpy(), w, f"variable {i} after the failed fetch")

    # 3. a model of another size
    if rank == 2:
        shorter = variables[:-1] + [tf.Variable(np.zeros(300_000))]
        try:
            state_sync.fetch_state(shorter, [0, 1], "test/state", min_version=5)
            chk.fail("a fetch into a smaller model succeeded")
        except tf.errors.InvalidArgumentError as e:
            print(f"size: {e.message}", flush=True)
            chk.true("bytes but the request expects" in e.message, f"the error names the sizes: {e}")
        chk.equal(shorter[-1].numpy(), np.zeros(300_000), "the shorter variable after the refused fetch")
        done.touch()
    else:
        wait_for(done)
    ops.barrier()
    if rank < 2:
        state_sync.forget_state("test")
    print(f"checked {chk.count} results", flush=True)


if __name__ == "__main__":
    main()
