"""Reduce to a root (tests/workers/reduce_root.py), np=2 and np=3.

For root 0 and root np-1, eagerly and in a tf.function: every op on every
dtype (and one multi-chunk tensor); the root gets numpy's reduction, every
other worker its own input unchanged (also on RING and BINARY_TREE, where
non-roots pass partial results on). Then the traffic on a STAR topology,
from the runtime's byte counters: each non-root worker sends about B bytes
to the root and the root sends nothing (an all-reduce of B bytes, for
contrast, has the root send B bytes to every worker). A root outside the
cluster fails with InvalidArgumentError, a negative one with ValueError.
A non-root's unused reduce output passed to ops.keep_alive still runs.
"""

from __future__ import annotations

import pytest
from conftest import assert_job_ok, run_job

FLOAT_DTYPES, INT_DTYPES, SHAPES = 4, 3, 2


def expected_checks() -> int:
    per_root = SHAPES * (FLOAT_DTYPES * 5 + INT_DTYPES * 4) + 1  # + the multi-chunk sum
    collectives = 2 * 2 * per_root  # roots 0 and np-1, eager and tf.function
    inner_nodes = 2 * (1 + 3)  # RING and BINARY_TREE: set_topology + 3 cases
    keep_alive = 3  # steps of the tf.function with an unused reduce on non-roots
    return collectives + inner_nodes + 3 + 2 + keep_alive  # + set_topology + 2 traffic checks, bad roots


@pytest.mark.parametrize("np_", [2, 3])
def test_reduce_to_root(np_):
    rc, out, err = run_job(np_, "reduce_root.py", timeout=180, extra_launcher_args=["--timeout", "30"])
    assert_job_ok(rc, out, err, np_, expected_checks())
