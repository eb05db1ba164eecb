"""Worker for test_input_validation.py: p2p/rows ops given a non-scalar where a scalar belongs.

Usage: bad_scalar_inputs.py [CASE ...]   (run directly, without kungfu-run: a one-worker cluster;
no CASE: all of them)

Runs each CASE eagerly and then inside a tf.function. Each must raise
InvalidArgumentError whose message names the op and the input; TensorFlow's
own scalar accessor would abort the whole process instead (SIGABRT), which
the test sees as the exit status, after the line "case CASE" of the case
that aborted. After each error the worker must still work: a save/request
round trip returns what was saved. Ends with "checked N results" (4 per
case: two errors, two round trips).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from _setup import Checker, np, tf

from kungfu_tf.ops import p2p

LIKE = tf.zeros([2])
ROWS = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([4, 2]))
TABLE = tf.zeros([4, 2])
NO_ROWS = tf.zeros([0], tf.int32)

# case -> (the call, the text its error must contain)
CASES: dict[str, tuple[Callable[[], object], str]] = {
    "request_rank": (lambda: p2p.request([0, 1], "w", LIKE), "KungfuRequest: input 'rank' must be a scalar"),
    "request_version": (
        lambda: p2p.request(0, "w", LIKE, version=[1, 2]),
        "KungfuRequest: input 'version' must be a scalar",
    ),
    "request_at_least_rank": (
        lambda: p2p.request_at_least([0, 1], "w", 1, LIKE),
        "KungfuRequestAtLeast: input 'rank' must be a scalar",
    ),
    "request_at_least_min_version": (
        lambda: p2p.request_at_least(0, "w", [1, 2], LIKE),
        "KungfuRequestAtLeast: input 'min_version' must be a scalar",
    ),
    "save_version": (lambda: p2p.save("w", LIKE, version=[1, 2]), "KungfuSave: input 'version' must be a scalar"),
    "push_rank": (lambda: p2p.push([0, 1], "g", LIKE), "KungfuPush: input 'rank' must be a scalar"),
    "push_rows_rank": (
        lambda: p2p.push_rows([0, 1], "t", ROWS, 4),
        "KungfuPushRows: input 'rank' must be a scalar",
    ),
    "push_rows_num_rows": (
        lambda: p2p.push_rows(0, "t", ROWS, [4, 4]),
        "KungfuPushRows: input 'num_rows' must be a scalar",
    ),
    "save_rows_version": (
        lambda: p2p.save_rows("t", TABLE, NO_ROWS, [1, 2]),
        "KungfuSaveRows: input 'version' must be a scalar",
    ),
    "request_rows_rank": (
        lambda: p2p.request_rows([0, 1], "t", 1, [4, 2], tf.float32),
        "KungfuRequestRows: input 'rank' must be a scalar",
    ),
    "request_rows_min_version": (
        lambda: p2p.request_rows(0, "t", [1, 2], [4, 2], tf.float32),
        "KungfuRequestRows: input 'min_version' must be a scalar",
    ),
}


def round_trip(chk: Checker, step: int) -> None:
    value = np.array([step, -step], np.float32)
    p2p.save("alive", tf.constant(value))
    chk.equal(p2p.request(0, "alive", like=LIKE).numpy(), value, f"save/request after the error ({step})")


def traced(call: Callable[[], object]) -> Callable[[], tf.Tensor | None]:
    """``call`` in a tf.function; its output is returned so that stateless ops run too."""

    def body():
        out = call()
        return None if isinstance(out, tf.Operation) else out

    return tf.function(body, autograph=False)


def main() -> None:
    chk = Checker(0)
    step = 0
    for case in sys.argv[1:] or list(CASES):
        print(f"case {case}", flush=True)
        call, needle = CASES[case]
        for mode, run in (("eager", call), ("tf.function", traced(call))):
            try:
                run()
            except tf.errors.InvalidArgumentError as e:
                chk.true(needle in str(e), f"{case} ({mode}): error names the input: {needle!r} not in {str(e)!r}")
            else:
                chk.fail(f"{case} ({mode}): no InvalidArgumentError")
            step += 1
            round_trip(chk, step)
    chk.done()


if __name__ == "__main__":
    main()
