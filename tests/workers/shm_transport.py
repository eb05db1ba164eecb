"""Worker for test_shm_transport.py: all-reduces over whichever same-host transport is in force.

Usage: shm_transport.py

Sums float32 tensors of 1 element, 1 MiB and 12 MiB (several times a
shared-memory ring, so large pieces wrap and wait for space) in a
tf.function, each checked against numpy's sum of every rank's input. Then
prints "rings N": how many shared-memory rings (memfd "kungfu-shm-ring")
this process has mapped, read from /proc/self/maps, so the test sees which
transport really carried the frames. Ends with "checked N results".
"""

from __future__ import annotations

from _setup import Checker, np, ops, tf

import kungfu_tf

SIZES = (1, 1 << 18, 3 << 20)  # elements


def ring_mappings() -> int:
    """Distinct shared-memory rings mapped into this process."""
    with open("/proc/self/maps") as f:
        return len({line.split()[4] for line in f if "kungfu-shm-ring" in line})


def rank_input(rank: int, n: int) -> np.ndarray:
    return (np.arange(n, dtype=np.float32) % 89) * (rank + 1) + rank


@tf.function
def step(x: tf.Tensor) -> tf.Tensor:
    return ops.all_reduce(x, op="sum")


def main() -> None:
    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    chk = Checker(rank)
    for n in SIZES:
        want = sum(rank_input(r, n) for r in range(size))
        for _ in range(2):
            chk.equal(step(tf.constant(rank_input(rank, n))).numpy(), want, f"all_reduce of {n} floats")
    print(f"rings {ring_mappings()}", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
