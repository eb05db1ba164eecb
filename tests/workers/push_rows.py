"""Worker for tests/test_p2p.py::test_rows (np=3): tables moved by rows, through the TF ops.

Usage: push_rows.py

* push_rows/take_rows: ranks 1 and 2 push IndexedSlices (repeated indices
  included, int32 and int64 indices, eagerly and in a tf.function) into rank
  0's table accumulator; after a barrier rank 0 takes numpy's scatter-add of
  every push, only the touched rows, ascending, and the push count; the next
  take is empty. A push with a row outside the table is dropped whole and
  rank 0's next take raises InvalidArgumentError naming rank 2 and the row.
* save_rows/request_rows: rank 0 saves a table, then versions that change a
  few rows; rank 1's first request gets every row, later ones only the rows
  changed since its last request, and scattering them into its copy gives
  rank 0's table. A request with another table shape raises
  InvalidArgumentError.

Ends with "checked N results" (N per rank: see test_p2p.py).
"""

from __future__ import annotations

import _setup
from _setup import Checker, np, ops, tf

from kungfu_tf.ops import p2p

ROWS, DIM = 50, 3


def pushes_of(rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(rank)
    out = []
    for n in (4, 1, 6):
        rows = rng.integers(0, ROWS, n)
        rows[-1] = rows[0]  # a repeated row adds twice
        out.append((rows, rng.integers(-5, 5, (n, DIM)).astype(np.float32)))
    return out


def as_slices(rows: np.ndarray, values: np.ndarray, index_dtype: tf.DType) -> tf.IndexedSlices:
    return tf.IndexedSlices(tf.constant(values), tf.constant(rows, index_dtype), tf.constant([ROWS, DIM]))


def run_push_take(chk: Checker, rank: int, size: int) -> None:
    if rank > 0:
        eager, in_function = pushes_of(rank)[:2], pushes_of(rank)[2:]
        for rows, values in eager:
            p2p.push_rows(0, "table/grad", as_slices(rows, values, tf.int32), ROWS)

        @tf.function
        def push(slices):
            p2p.push_rows(0, "table/grad", slices, ROWS)

        for rows, values in in_function:
            push(as_slices(rows, values, tf.int64))
    ops.barrier(name="rows_pushed")
    if rank == 0:
        want = np.zeros((ROWS, DIM), np.float32)
        touched: set[int] = set()
        for r in range(1, size):
            for rows, values in pushes_of(r):
                np.add.at(want, rows, values)
                touched.update(int(i) for i in rows)
        rows, sums, count = p2p.take_rows("table/grad", [ROWS, DIM], tf.float32)
        chk.equal(rows.numpy(), np.array(sorted(touched), np.int64), "take_rows: the touched rows, ascending")
        chk.equal(sums.numpy(), want[sorted(touched)], "take_rows: numpy's scatter-add")
        chk.equal(int(count), 3 * (size - 1), "take_rows: pushes")
        rows, sums, count = p2p.take_rows("table/grad", [ROWS, DIM], tf.float32)
        chk.equal((rows.shape[0], sums.shape[0], int(count)), (0, 0, 0), "the next take is empty")
    ops.barrier(name="rows_taken")
    if rank == size - 1:
        p2p.push_rows(0, "table/grad", as_slices(np.array([1, ROWS]), np.ones((2, DIM), np.float32), tf.int32), ROWS)
    ops.barrier(name="bad_row_pushed")
    if rank == 0:
        try:
            p2p.take_rows("table/grad", [ROWS, DIM], tf.float32)
            chk.fail("a push with a row outside the table was not reported")
        except tf.errors.InvalidArgumentError as e:
            msg = str(e)
            chk.true(f"rank {size - 1}" in msg and f"row {ROWS} is outside the table's {ROWS} rows" in msg, msg)
        rows, _, count = p2p.take_rows("table/grad", [ROWS, DIM], tf.float32)
        chk.equal((rows.shape[0], int(count)), (0, 0), "nothing of the bad push was added")


def run_save_request(chk: Checker, rank: int) -> None:
    rng = np.random.default_rng(9)
    table = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    changes = [np.array([3, 7]), np.array([7, 40]), np.array([11])]
    if rank == 0:
        p2p.save_rows("table/value", tf.constant(table), tf.zeros([0], tf.int32), version=1)
    if rank == 1:
        rows, values, version = p2p.request_rows(0, "table/value", 1, [ROWS, DIM], tf.float32)
        chk.equal(rows.numpy(), np.arange(ROWS), "the first request: every row")
        chk.equal(int(version), 1, "the first request: version 1")
        copy = values.numpy().copy()
    ops.barrier(name="first_fetch")
    for v, rows in enumerate(changes, start=2):
        table[rows] += 1.0
        if rank == 0:
            p2p.save_rows("table/value", tf.constant(table), tf.constant(rows, tf.int32), version=v)
    ops.barrier(name="versions_saved")
    if rank == 1:
        rows, values, version = p2p.request_rows(0, "table/value", 3, [ROWS, DIM], tf.float32)
        chk.equal(rows.numpy(), np.array([3, 7, 11, 40]), "later: only the rows changed since")
        chk.equal(int(version), 4, "later: the newest version")
        copy[rows.numpy()] = values.numpy()
        chk.equal(copy, table, "the copy with the changed rows scattered is the owner's table")
        try:
            p2p.request_rows(0, "table/value", 1, [ROWS, DIM + 1], tf.float32)
            chk.fail("a request with another table shape did not fail")
        except tf.errors.InvalidArgumentError as e:
            chk.true(f"the owner's table has {ROWS} rows of 12 bytes" in str(e) and "16 bytes" in str(e), str(e))


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    run_push_take(chk, rank, size)
    run_save_request(chk, rank)
    chk.done()


if __name__ == "__main__":
    main()
