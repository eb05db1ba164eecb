"""The gradient-noise-scale monitor across strategy switches: tests/workers/gradient_monitor_switch.py.

Combined features are where users break things: ``SynchronousSGDOptimizer(strategy=..., monitor=...)``
switched AllReduce -> PartitionedAR -> AllReduce by ``switch_strategy`` mid-run, with SGD
momentum (its slot moves at each switch). On every worker and at every step the monitor's GNS, raw
estimate, smoothed noise trace and squared gradient norm, and gradient variance equal a numpy replay of
the estimator on every worker's data (rtol 1e-4), so the smoothed state continues across the switches and
the re-traced steps feed the monitor the whole averaged gradient; a switch to PS is refused with nothing
changed.
"""

from __future__ import annotations

import pytest
from conftest import assert_job_ok, rank_lines, run_job

STEPS, REPLAYED = 12, 5


def expected_checks() -> int:
    # Keep in step with tests/workers/gradient_monitor_switch.py.
    compared = STEPS * REPLAYED
    switches = 2 + 1  # each switch's report, PartitionedAR's cut
    refusal = 3  # the error names the monitor, the plan and the monitor's values unchanged
    return compared + switches + refusal + 1  # + the step's traces


@pytest.mark.parametrize("np_", [2, 3])
def test_the_monitor_matches_numpy_across_strategy_switches(np_):
    rc, out, err = run_job(np_, "gradient_monitor_switch.py", timeout=240)
    assert_job_ok(rc, out, err, np_, expected_checks())
    assert any(line.startswith(f"np={np_}: GNS ") for line in rank_lines(out)[0]), out
