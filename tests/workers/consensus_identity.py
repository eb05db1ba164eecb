"""Worker for test_consensus.py (np=2): consensus agrees on dtype, shape and bytes.

Usage: consensus_identity.py

Rank 0 and rank 1 pass tensors whose data bytes are identical but whose
dtype or shape differ (float32 zeros vs int32 zeros, float32[2] vs
float64[1], [2, 3] vs [3, 2], [6] vs [2, 3], [] vs [1]): consensus must be
False on both ranks. Identical tensors must give True. Each case runs
eagerly and in a tf.function. Ends with "checked N results" (2 modes x 7 cases = 14).
"""

from __future__ import annotations

from _setup import Checker, env_rank, ops, tf

# name -> (rank 0's tensor, rank 1's tensor, agreed)
CASES = {
    "float32 vs int32 zeros": (lambda: tf.zeros([4], tf.float32), lambda: tf.zeros([4], tf.int32), False),
    "float32[2] vs float64[1]": (lambda: tf.zeros([2], tf.float32), lambda: tf.zeros([1], tf.float64), False),
    "[2, 3] vs [3, 2]": (lambda: tf.zeros([2, 3]), lambda: tf.zeros([3, 2]), False),
    "[6] vs [2, 3]": (lambda: tf.zeros([6]), lambda: tf.zeros([2, 3]), False),
    "[] vs [1]": (lambda: tf.constant(7), lambda: tf.constant([7]), False),
    "same int32": (lambda: tf.zeros([4], tf.int32), lambda: tf.zeros([4], tf.int32), True),
    "same float32 [2, 3]": (lambda: tf.ones([2, 3]), lambda: tf.ones([2, 3]), True),
}


def main() -> None:
    rank = env_rank()
    chk = Checker(rank)
    for mode in ("eager", "tf.function"):
        for i, (what, (first, second, agreed)) in enumerate(CASES.items()):
            make = first if rank == 0 else second
            name = f"{mode}/{i}"

            def agree(make=make, name=name):
                return ops.consensus(make(), name=name)

            run = agree if mode == "eager" else tf.function(agree, autograph=False)
            chk.equal(bool(run().numpy()), agreed, f"consensus {what} ({mode})")
    chk.done()


if __name__ == "__main__":
    main()
