"""benchmarks/strategy_policy: phase accounting on made-up steps, and its smallest configuration end to end.

The end-to-end run is the real benchmark (two network namespaces, a ``tc``
link throttled and restored by the driver, real workers) at np = 2 with a
small MLP and few steps: it checks the structure of the results and that
every worker of the policy's run ran the same strategy at every step and
logged the same decisions. Not timings: which strategy wins on a loaded
machine is what the benchmark measures, not what a test may assume.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.harness.paths import REPO
from benchmarks.strategy_policy.run import agreement, summarize


def steps_of(durations: list[float], strategies: list[str]) -> list[dict]:
    out, t = [], 100.0
    for i, (d, s) in enumerate(zip(durations, strategies, strict=True)):
        out.append({"step": i, "start": t, "end": t + d, "strategy": s})
        t += d
    return out


def test_phases_medians_throughput_and_switches_of_made_up_steps():
    # 3 steps of 1 s on PS; the throttle at 103.5 (inside step 3); 4 steps of 2 s, the last two on AllReduce;
    # restored at 111 (the end of step 6); 2 steps of 0.5 s.
    strategies = ["PS"] * 5 + ["AllReduce"] * 4
    s = summarize({"steps": steps_of([1, 1, 1, 2, 2, 2, 2, 0.5, 0.5], strategies), "batch_size": 8,
                   "throttled_at": 103.5, "restored_at": 111.0})  # fmt: skip
    assert s["steps"] == {"before": 3, "during": 3, "after": 2, "transition": 1}
    assert s["median_step"] == {"before": 1, "during": 2, "after": 0.5}
    assert s["throughput"] == pytest.approx({"before": 8.0, "during": 4.0, "after": 16.0})
    assert s["during_second_half"] == pytest.approx(4.0)  # steps 5 and 6
    assert s["strategies"] == {"before": ["PS"], "during": ["AllReduce", "PS"], "after": ["AllReduce"]}
    assert s["switches"] == [{"step": 5, "phase": "during", "from": "PS", "to": "AllReduce"}]


def test_workers_agree_only_on_the_same_strategies_and_decisions():
    one = {"strategies": ["PS", "AllReduce"], "decisions": ["step 1: strategy PS -> AllReduce (trial)"]}
    assert agreement([one, dict(one)])
    assert not agreement([one, {**one, "strategies": ["PS", "PS"]}])
    assert not agreement([one, {**one, "decisions": []}])


def test_smallest_configuration_end_to_end(tmp_path):
    out = tmp_path / "strategy_policy.json"
    steps = {"before": 6, "during": 14, "after": 8}
    cmd = [sys.executable, "-m", "benchmarks.strategy_policy", "--np", "2", "--input-dim", "64", "--hidden", "256,256",
           "--batch-size", "8", "--slow", "5mbit", "--window", "2", "--trial-steps", "2", "--json", str(out)]  # fmt: skip
    cmd += [f"--{k}={v}" for k, v in steps.items()]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    report = f"exit {done.returncode}\n--- stdout ---\n{done.stdout[-6000:]}\n--- stderr ---\n{done.stderr[-6000:]}"
    assert done.returncode == 0, report
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == [
        "StrategyPolicy (starts on PSLoadBalancing)", "static PSLoadBalancing", "static AllReduce"
    ], report  # fmt: skip
    total = sum(steps.values())
    for run in runs:
        assert [s["step"] for s in run["steps"]] == list(range(total)), run["label"]
        assert run["throttled_at"] < run["restored_at"], run["label"]
        s = summarize(run)
        assert all(s["steps"][p] > 0 for p in ("before", "during", "after")), (run["label"], s["steps"])
        assert sum(s["steps"].values()) == total
        # Every rank reported the strategy of every step, and they are the same (checked here, not only by
        # the driver's own agreement()).
        assert len(run["rank_strategies"]) == 2 and len(run["rank_strategies"][0]) == total, run["label"]
        assert run["rank_strategies"][0] == run["rank_strategies"][1], run["label"]
        assert run["ranks_agree"], run["label"]
        assert [st["strategy"] for st in run["steps"]] == run["rank_strategies"][0], run["label"]
        if not run["policy"]:
            assert set(run["rank_strategies"][0]) == {run["strategy"]} and run["decisions"] == [], run["label"]
    policy = runs[0]
    assert set(policy["rank_strategies"][0]) <= {"PSLoadBalancing", "AllReduce"}
    # The rank-0 record of each switch the policy made matches a change of strategy between steps (one made
    # after the last step shows in no step).
    changes = [(c["from"], c["to"]) for c in summarize(policy)["switches"]]
    made = [(sw["old"], sw["new"]) for sw in policy["switch_seconds"] if sw["old"] != sw["new"]]
    assert made[: len(changes)] == changes and len(made) - len(changes) <= 1, report
    for table in ("| run | before | during | during, 2nd half | after |", "| phase | best static |"):
        assert table in done.stdout, report
