"""The copies of a stale or asynchronous parameter server's variables, made the owners' values again
(kungfu_tf/optimizers/stale_copies.py; tests/workers/stale_copies.py at np=3).

Each worker holds a copy of every variable; under ``PS(sync=False)`` (or ``staleness=K``) a copy is the
owner's value as of the worker's last fetch. ``sync_stale_copies`` gives every worker the owners' values bit
for bit, and a strategy switch does it before the new plan starts: before, each worker's AllReduce plan
started from its own copy, and the workers' weights never met again.
"""

from __future__ import annotations

from conftest import assert_job_ok, run_job


def test_every_worker_takes_the_owners_values():
    rc, out, err = run_job(3, "stale_copies.py", timeout=180)
    assert_job_ok(rc, out, err, 3, expected_checks=16)
