"""Worker for test_failures.py::test_mismatched_shapes.

Usage: failure_mismatch.py

For several topologies: an all-reduce whose shape differs on rank 1 ([2,3]
against [6]), one whose element count differs on rank 1 (600001 against
600000 float32: several chunks) and one whose dtype differs on the last rank (int32 against
float32). Every worker must get InvalidArgumentError naming the key and both
shapes, quickly; then a correct all-reduce under each failed key must give
the exact sum (no residue of the failed attempt). Reports

    mismatch <key> after <seconds>s: <message>

per failed collective and ends with "checked N results".
"""

from __future__ import annotations

import time

import _setup
from _setup import Checker, make_input, ops, reduce_ref, tf

TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "CLIQUE")


def expect_invalid(chk: Checker, key: str, x: tf.Tensor, needles: list[str]) -> None:
    t = time.monotonic()
    try:
        ops.all_reduce(x, name=key)
    except tf.errors.InvalidArgumentError as e:
        elapsed = time.monotonic() - t
        message = " ".join(str(e.message).split())
        print(f"mismatch {key} after {elapsed:.3f}s: {message}", flush=True)
        for needle in [key, *needles]:
            chk.true(needle in message, f"{key}: {needle!r} is not in the error: {message}")
        # Detected when the shapes meet, not at the 60 s timeout: that is told
        # by the error itself (a timeout raises DeadlineExceededError, not
        # InvalidArgumentError naming both shapes), not by the clock.
        return
    except tf.errors.OpError as e:
        chk.fail(f"{key}: expected InvalidArgumentError, got {type(e).__name__}: {e.message}")
    chk.fail(f"{key}: mismatched all-reduce succeeded")


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    for topo in TOPOLOGIES:
        chk.true(bool(ops.set_topology(topo).numpy()), f"set_topology({topo})")
        shape = (2, 3) if rank == 1 else (6,)
        expect_invalid(chk, f"shape_mismatch/{topo}", tf.ones(shape, tf.float32), ["float32[6]", "float32[2,3]"])
        # Different element counts, over several 1 MiB chunks.
        n = 600_001 if rank == 1 else 600_000
        expect_invalid(chk, f"size_mismatch/{topo}", tf.ones([n], tf.float32), ["float32[600000]", "float32[600001]"])
        dtype = tf.int32 if rank == size - 1 else tf.float32
        expect_invalid(chk, f"dtype_mismatch/{topo}", tf.ones([6], dtype), ["float32[6]", "int32[6]"])
        # The failures leave the job usable and leave nothing behind: a retry
        # under the *same* key (a traced graph reuses its keys every step)
        # gives numpy's sum, never a late piece of the failed attempt.
        for kind in ("shape", "size", "dtype"):
            key = f"{kind}_mismatch/{topo}"
            xs = [make_input(key, r, (1001,), "int32", "real") for r in range(size)]
            got = ops.all_reduce(tf.constant(xs[rank]), name=key).numpy()
            chk.equal(got, reduce_ref(xs, "sum", "int32"), f"retry of {key} after its failure")
    ops.barrier(name="end")
    chk.done()


if __name__ == "__main__":
    main()
