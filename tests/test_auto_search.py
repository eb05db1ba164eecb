"""builders.Auto and its trials with real workers (kungfu-run, np = 2).

* tests/workers/auto_trials.py: a trial that failed on one worker (in its
  switch or in a step) fails on every worker after the same steps; the
  measured time is the slowest worker's, the same number everywhere;
  workers holding different candidates stop with a StrategyError.
"""

from __future__ import annotations

from conftest import assert_job_ok, run_job


def test_trials_agree_on_failure_measurement_and_candidate():
    rc, out, err = run_job(2, "auto_trials.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=9)
