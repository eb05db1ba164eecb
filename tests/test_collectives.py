"""The collective matrix, on real multi-worker jobs (tests/workers/collectives.py).

One launch per cluster size. Each worker runs, in eager mode, inside one
tf.function and in a tf.compat.v1 Graph run by a Session, for every topology
(switched with set_topology in that mode):

* all_reduce with sum/min/max/prod/mean, broadcast from every root,
  all_gather, consensus (agreeing and disagreeing) on every dtype for the
  shapes [0], [] and [7, 11, 13] (1001 elements);
* group_all_reduce over all dtypes at once (one fused collective per dtype)
  for every op, a barrier, and a consensus on equal bytes in different shapes;
* the configuration ops (rank, cluster_size, local_rank, local_size,
  cluster_version, topology) in that mode.

Then once per job: the Python-int helpers, mean on integers (ValueError), a
barrier that must not release anyone early, one 64 MiB float32 all-reduce and
one 64 MiB broadcast, and comm_rates().

Workers compare every output with numpy (inputs are deterministic per rank,
so each worker recomputes everybody's) and exit non-zero on the first
mismatch. The count of checked results must match expected_checks() exactly,
so a worker that skipped part of the matrix fails the test too.
"""

from __future__ import annotations

import pytest
from conftest import assert_job_ok, describe, rank_lines, run_job

MODES = 3  # eager, tf.function, v1 Session
TOPOLOGIES = 6
DTYPES = 7
FLOAT_DTYPES = 4
SHAPES = 3


def expected_checks(np_: int) -> int:
    """Results each worker must check (keep in step with workers/collectives.py)."""
    per_dtype_shape = 4 + 1 + 2  # all_reduce sum/min/max/prod, all_gather, 2 consensus
    per_dtype_shape += np_  # broadcast from every root
    per_topology = SHAPES * (DTYPES * per_dtype_shape + FLOAT_DTYPES)  # + mean on floats
    per_topology += 4 * DTYPES * SHAPES + FLOAT_DTYPES * SHAPES  # group_all_reduce members
    per_topology += 2  # consensus on shapes, barrier
    per_topology += 2  # set_topology returned True, topology() reports it
    per_mode = TOPOLOGIES * per_topology + 5  # + rank/size/local_rank/local_size/version
    extras = 4 + 3 + 1 + 2 + 1  # int helpers, mean ValueErrors, timed barrier, 64 MiB x2, comm_rates
    return MODES * per_mode + extras


def test_expected_checks_formula():
    # Hand-counted for np=1: 6 topologies x 280 results x 3 modes + 15 + 11.
    assert expected_checks(1) == 5066
    assert expected_checks(4) - expected_checks(3) == MODES * TOPOLOGIES * SHAPES * DTYPES


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_collective_matrix(np_):
    rc, out, err = run_job(np_, "collectives.py", np_, timeout=240)
    assert_job_ok(rc, out, err, np_, expected_checks(np_))
    lines = rank_lines(out)
    for r in range(np_):
        # Every mode ran to its end on every rank.
        for mode in ("eager", "function", "session"):
            assert any(line.startswith(f"{mode} done") for line in lines[r]), f"rank {r}: no '{mode} done'\n" + describe(
                rc, out, err
            )
    assert "MISMATCH" not in err
