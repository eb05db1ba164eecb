"""Link calibration on a real 2-worker job: positive rates, identical on every worker, cached.

The worker (tests/workers/auto_calibration.py) calls ``calibrate`` three
times: a probe, a cache hit, a forced probe. Here the printed rates of both
workers must be byte-identical for each call (every worker gets the same
answer), and the cache file must exist afterwards.
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_job_ok, rank_lines, run_job

from kungfu_tf.strategy.auto.calibration import calibrate
from kungfu_tf.strategy.errors import StrategyError


def test_calibration_agrees_on_every_worker_and_is_cached(tmp_path):
    rc, out, err = run_job(2, "auto_calibration.py", tmp_path, timeout=180, extra_launcher_args=["--timeout", "60"])
    assert_job_ok(rc, out, err, 2, expected_checks=3 * 2 * 2 + 2)
    lines = {r: [line.split(" ", 2) for line in ls if line.startswith("rates ")] for r, ls in rank_lines(out).items()}
    assert [origin for _, origin, _ in lines[0]] == ["probe", "cache", "probe"]
    for call in range(3):
        assert lines[0][call] == lines[1][call], f"call {call}: the workers got different rates"
    cached = list(tmp_path.glob("link_rates-np2-*.json"))
    assert len(cached) == 1, list(tmp_path.iterdir())
    assert json.loads(cached[0].read_text())["signature"] == "np=2 hosts=0,0"


def test_a_failed_probe_is_a_strategy_error_on_every_worker(tmp_path):
    rc, out, err = run_job(2, "auto_calibration.py", tmp_path, "mismatch", timeout=180, extra_launcher_args=["--timeout", "30"])
    assert_job_ok(rc, out, err, 2, expected_checks=1)
    for rank, lines in rank_lines(out).items():
        failed = [line for line in lines if line.startswith("failed: ")]
        assert len(failed) == 1, lines
        # The runtime's reason, without TF's internal function name in front of it.
        assert failed[0].startswith(f"failed: link calibration failed on rank {rank} of 2: request "), failed[0]
        assert "the saved blob has" in failed[0], failed[0]
    assert not list(tmp_path.glob("link_rates-*.json")), "a failed probe must not be cached"


def test_one_worker_cannot_be_calibrated(tmp_path):
    with pytest.raises(StrategyError, match="one-worker cluster: there are no links to measure"):
        calibrate(cache_dir=tmp_path)
