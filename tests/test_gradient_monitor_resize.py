"""The GradientMonitor stays right across resizes (tests/workers/gradient_monitor_resize.py, real workers).

Before, the monitor chose its estimator when the step was traced: a worker traced alone (a job started
at one worker, or a joiner's warm-up) kept the one-worker pairing form, and sent 0 as its squared
gradient norm, so after 2 -> 3 the members reported one GNS and the joiner another (8.28 and 43.4 where
the closed form is 41), and a growth from 1 never estimated at all. Each case here: every worker's
values equal a numpy replay of the estimator at the sizes of each step, bitwise equal on every worker,
the joiner's from its first step on (it received the smoothed state), and the final smoothed
noise_trace, grad_sq_norm and GNS are each near the closed form at the weights the steps saw (constant at
learning rate 0). The replay follows the sizes the steps really ran at, recorded in the elastic state
with each committed step.

4 -> 2 (crash): no resize; two of four workers are SIGKILLed as a step begins and the launcher does not
replace them (``--min-np 2``). The survivors' step fails, ``elastic.run`` recovers (renumbering them) and
the step runs again at 2 workers: the record shows it at 2, and nothing of the failed attempt (a monitor
update, a weight update: learning rate > 0) may remain.
"""

from __future__ import annotations

import re

import pytest
from conftest import describe, run_job

BEFORE, AFTER = 40, 160


@pytest.mark.parametrize(
    ("from_size", "to_size", "lr"),
    [(1, 3, 0.0), (2, 3, 0.005), (3, 1, 0.0)],
    ids=["1->3", "2->3 lr>0", "3->1"],
)
def test_the_monitor_follows_the_cluster_size(from_size, to_size, lr):
    rc, out, err = run_job(from_size, "gradient_monitor_resize.py", from_size, BEFORE, AFTER, to_size, lr,
                           timeout=240, extra_launcher_args=["--elastic", "--min-np", "1", "--max-np", "3"])  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    assert "MISMATCH" not in err, report
    finals = re.findall(r"^\[\d+\] final gns ([\d.]+) size (\d+) step (\d+)$", out, re.MULTILINE)
    assert len(finals) == to_size and {(s, n) for _, s, n in finals} == {(str(to_size), str(BEFORE + AFTER))}, report
    assert len({g for g, _, _ in finals}) == 1, report  # the same estimate everywhere
    assert len(re.findall(r"^\[\d+\] checked \d+ results$", out, re.MULTILINE)) == to_size, report
    assert len(re.findall(r"^\[\d+\] detached$", out, re.MULTILINE)) == max(0, from_size - to_size), report


def test_the_monitor_follows_a_crash_from_4_to_2():
    rc, out, err = run_job(4, "gradient_monitor_resize.py", 4, BEFORE, AFTER, 2, 0.005, "1,3",
                           timeout=240, extra_launcher_args=["--min-np", "2"])  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    assert "MISMATCH" not in err, report
    assert sorted(re.findall(r"^\[(\d+)\] crashes at step (\d+)$", out, re.MULTILINE)) == [("1", str(BEFORE)), ("3", str(BEFORE))], report
    assert len(re.findall(r"killed by signal SIGKILL", err)) == 2 and "started joiner" not in out + err, report
    finals = re.findall(r"^\[(\d+)\] final gns ([\d.]+) size (\d+) step (\d+)$", out, re.MULTILINE)
    assert sorted((r, s, n) for r, _, s, n in finals) == [("0", "2", str(BEFORE + AFTER)), ("2", "2", str(BEFORE + AFTER))], report
    assert len({g for _, g, _, _ in finals}) == 1, report
    assert len(re.findall(r"^\[\d+\] checked \d+ results$", out, re.MULTILINE)) == 2, report
