"""Worker for test_input_validation.py::test_rejected_inputs_leave_workers_working (np=2).

Usage: rejected_inputs.py

Every worker gives the same bad input to the kernels directly (raw key
tensors, bypassing the Python checks), eagerly and in a tf.function:

* a key of 5000 bytes (over the 1024-byte limit; a frame allows 4096, and
  the receiver used to drop the whole connection on a longer one),
* a key containing '\\x01' (the runtime's sub-key separator),
* a 9-dimensional tensor (a frame header holds 8 dimensions).

Each must fail with InvalidArgumentError naming the cause on every worker,
before anything is sent, and the next all_reduce must equal numpy's sum.
Ends with "checked N results" (6 errors + 6 all-reduces = 12).
"""

from __future__ import annotations

from _setup import Checker, env_rank, env_size, np, ops, tf

from kungfu_tf._native import library

X = tf.ones([3])
CASES = (
    ("long key", lambda: library().kungfu_all_reduce(X, tf.constant("k" * 5000)), "names may be at most 1024 bytes"),
    (
        "key with \\x01",
        lambda: library().kungfu_all_reduce(X, tf.constant("grads\x01barrier")),
        "reserved for internal sub-keys",
    ),
    (
        "9 dimensions",
        lambda: ops.all_reduce(tf.ones([1] * 8 + [3]), name="nine_dims"),
        "kungfu collectives support at most 8 dimensions, got 9 for KungfuAllReduce 'nine_dims'",
    ),
)


def main() -> None:
    rank, size = env_rank(), env_size()
    chk = Checker(rank)
    n = 0
    for what, call, needle in CASES:
        for mode, run in (("eager", call), ("tf.function", tf.function(call, autograph=False))):
            try:
                run()
            except tf.errors.InvalidArgumentError as e:
                chk.true(needle in str(e), f"{what} ({mode}): {needle!r} not in {str(e)!r}")
            else:
                chk.fail(f"{what} ({mode}): no InvalidArgumentError")
            n += 1
            mine = np.arange(3, dtype=np.float32) * (rank + 1) + n
            want = sum(np.arange(3, dtype=np.float32) * (r + 1) + n for r in range(size))
            got = ops.all_reduce(tf.constant(mine), name=f"after/{n}").numpy()
            chk.equal(got, want, f"all_reduce after {what} ({mode})")
    chk.done()


if __name__ == "__main__":
    main()
