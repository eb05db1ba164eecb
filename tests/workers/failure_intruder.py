"""Worker for test_failures.py::test_intruders (np=2).

Usage: failure_intruder.py DIR

Rank 0 writes DIR/peers.json (KUNGFU_PEERS, KUNGFU_SELF, KUNGFU_JOB_ID) once the runtime is
up, then both ranks loop over checked all-reduces until the test creates
DIR/stop (rank 0 broadcasts the decision each step, so both stop at the same
step). Meanwhile the test connects to rank 0 with garbage and forged
handshakes. Ends with "steps N" and "checked N results" (2 per step + 2).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import _setup
from _setup import Checker, make_input, ops, reduce_ref, tf

LIMIT_SECONDS = 90


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    chk.equal(ops.all_reduce(tf.ones([3]), name="warmup").numpy(), [size] * 3, "warm-up")
    if rank == 0:
        tmp = d / "peers.json.tmp"
        tmp.write_text(
            json.dumps(
                {
                    "peers": os.environ["KUNGFU_PEERS"],
                    "self": os.environ["KUNGFU_SELF"],
                    "job_id": os.environ["KUNGFU_JOB_ID"],
                }
            )
        )
        tmp.rename(d / "peers.json")
    start = time.monotonic()
    step = 0
    while True:
        n = 30_000 if step % 3 == 0 else 1001  # 120 KB: RING under AUTO; 4 KB: STAR
        xs = [make_input(f"intr/{step % 5}", r, (n,), "int32", "real") for r in range(size)]
        got = ops.all_reduce(tf.constant(xs[rank]), name=f"intr/{step}").numpy()
        chk.equal(got, reduce_ref(xs, "sum", "int32"), f"step {step}")
        stop = rank == 0 and ((d / "stop").exists() or time.monotonic() - start > LIMIT_SECONDS)
        decided = ops.broadcast(tf.constant(int(stop)), root=0, name=f"stop/{step}").numpy()
        chk.true(rank == 0 or not stop, "")
        step += 1
        if decided:
            break
    if time.monotonic() - start > LIMIT_SECONDS:
        chk.fail(f"the test never asked to stop within {LIMIT_SECONDS}s")
    final = ops.all_reduce(tf.constant([rank + 1] * 5), name="final").numpy()
    chk.equal(final, [size * (size + 1) // 2] * 5, "final all_reduce")
    print(f"steps {step}", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
