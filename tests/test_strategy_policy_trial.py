"""``StrategyPolicy`` in trial mode (no scorer) with real workers: it measures every candidate and keeps the best.

tests/workers/strategy_trial.py at np = 2 (``kungfu-run``): candidates PS, AllReduce and PartitionedPS, the
training loop made slower by a second per step under PS and PartitionedPS, so AllReduce is the better one by
construction. Every worker must log the same trial (the measured times are averaged over the workers, so
they are identical), switch to AllReduce at the same step, and end with the weights of one process trained
with plain Adam on the union batches. Before this test the trial mode had run only in unit tests with
made-up step times.
"""

from __future__ import annotations

import re

from conftest import assert_job_ok, describe, rank_lines, run_job

NP = 2
CANDIDATES = ["PS", "AllReduce", "PartitionedPS"]


def test_trials_choose_the_fastest_candidate_on_every_worker_and_train_like_one_process():
    rc, out, err = run_job(NP, "strategy_trial.py", timeout=300)
    assert_job_ok(rc, out, err, NP)
    report = describe(rc, out, err)
    lines = rank_lines(out)
    decisions, in_force = {}, {}
    for rank in range(NP):
        # "log: step N: TEXT [StrategyPolicy]" -> TEXT
        log = [re.sub(r"^log: step \d+: (.*) \[StrategyPolicy\]$", r"\1", line) for line in lines[rank] if line.startswith("log: ")]
        trials = [line for line in log if line.startswith("strategy trial")]
        assert trials == ["strategy trial (every 4 steps): measuring PS, AllReduce, PartitionedPS"], report
        # The trial's own switches, then the decision (its measured times are agreed: the same on every rank).
        chosen = [line for line in log if "trial; measured" in line]
        assert len(chosen) == 1 and "-> AllReduce" in chosen[0], report
        measured = re.search(r"measured \(s/step\): (.*)\)$", chosen[0])
        assert measured, chosen[0]
        times = dict(re.findall(r"(\w+) ([0-9.e+-]+)", measured.group(1)))
        assert sorted(times) == sorted(CANDIDATES), chosen[0]
        # The penalty is a second per step; AllReduce's own steps are milliseconds.
        assert float(times["AllReduce"]) < min(float(times["PS"]), float(times["PartitionedPS"])), chosen[0]
        decisions[rank] = measured.group(1)
        (final,) = [line for line in lines[rank] if line.startswith("final: ")]
        # Three trial switches (PS is switched to although in force: the policy does not know the
        # optimizer's own strategy is a candidate) and the decision.
        assert final == "final: AllReduce switches 4", report
        (force,) = [line for line in lines[rank] if line.startswith("in force: ")]
        in_force[rank] = force[len("in force: ") :].split(",")
    assert decisions[0] == decisions[1], decisions
    assert in_force[0] == in_force[1], in_force
    # Steps 0-3 under PS (trigger after step 3), a trial of 3 steps per candidate, then the winner.
    assert in_force[0] == ["PS"] * 4 + ["PS"] * 3 + ["AllReduce"] * 3 + ["PartitionedPS"] * 3 + ["AllReduce"] * 2
