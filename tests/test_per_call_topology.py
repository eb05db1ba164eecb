"""all_reduce / group_all_reduce with a per-call ``topology=``
(tests/workers/per_call_topology.py), np=3.

Every topology name and None (the runtime's current topology) in one
tf.function, run under two different current topologies, and eagerly; every
result against numpy. Unknown names fail in Python (ValueError) and in the
kernel (InvalidArgumentError); workers pinning different topologies for one
collective fail fast with FailedPreconditionError naming both.
"""

from __future__ import annotations

import re

from conftest import assert_job_ok, describe, rank_lines, run_job

NP = 3
CHOICES = 7  # six topology names and None
OUTPUTS = 3 + 4  # single all-reduces + group members per choice


def expected_checks() -> int:
    per_run = CHOICES * OUTPUTS
    function = 2 * (2 + per_run)  # set_topology True, topology(), results; twice
    eager = per_run
    errors = 2 + 1 + 3 + 1  # ValueErrors, kernel error, disagreement: 3 needles, after
    return function + eager + errors


def test_per_call_topology():
    rc, out, err = run_job(NP, "per_call_topology.py", timeout=180, extra_launcher_args=["--timeout", "30"])
    assert_job_ok(rc, out, err, NP, expected_checks())
    for r, lines in rank_lines(out).items():
        found = [m for m in (re.match(r"^disagree after ([\d.]+)s: (.*)$", line) for line in lines) if m]
        # FailedPreconditionError (the worker checks the class), not a timeout:
        # no clock bound, which raced three TF workers on two cores.
        assert len(found) == 1, f"rank {r}\n" + describe(rc, out, err)
