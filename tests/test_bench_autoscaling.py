"""benchmarks/autoscaling.py and tests/autoscale_records.py on made-up records whose numbers are known by
construction (no jobs: the end-to-end run is tests/test_autoscaling.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from autoscale_records import (
    load,
    scaling_efficiency,
    size_runs,
    step_sizes,
    throughput_by_size,
)
from autoscaling import Run, efficient_size_table, parse_args, straggler_table


def made_up(schedule: list[tuple[int, int, float]], batch: int = 100) -> list[dict]:
    """Step records: ``(size, steps, seconds per step)`` runs; every worker of a step ends it at the same time."""
    records, t, samples, step = [], 1000.0, 0, 0
    for size, count, seconds in schedule:
        for _ in range(count):
            samples += size * batch
            for rank in range(size):
                records.append({"event": "step", "step": step, "t0": t, "t1": t + seconds, "size": size, "rank": rank,
                                "samples": samples, "checksum": 1.0})  # fmt: skip
            t += seconds
            step += 1
    return records


def test_throughput_per_size_skips_the_steps_after_each_change(tmp_path):
    # 1 worker: 100 samples / 0.1 s = 1000/s; 2: 200 / 0.125 = 1600/s; 3: 300 / 0.2 = 1500/s. The first two steps
    # of each run are slower (a sync): they must not count.
    schedule = [(1, 2, 1.0), (1, 10, 0.1), (2, 2, 1.0), (2, 10, 0.125), (3, 2, 1.0), (3, 10, 0.2), (2, 2, 1.0), (2, 5, 0.125)]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in made_up(schedule)))
    records = load(path)
    assert [s for s, _, _ in size_runs(step_sizes(records))] == [1, 2, 3, 2]
    rates = throughput_by_size(records)
    assert rates == pytest.approx({1: 1000.0, 2: 1600.0, 3: 1500.0})
    assert scaling_efficiency(1, rates[1], 2, rates[2]) == pytest.approx(0.6)
    assert scaling_efficiency(2, rates[2], 3, rates[3]) == pytest.approx(-0.125)


def run(name: str, worker_s: float, training_s: float = 10.0) -> Run:
    return Run(name=name, ok=True, completion_s=training_s + 5, training_s=training_s, worker_s=worker_s, final_size=2,
               sizes=[1, 2], settle_s=None, throughput={1: 1000, 2: 1600})  # fmt: skip


def test_tables_compare_with_the_reference_runs():
    table = efficient_size_table([run("static 1", 50.0), run("static 3", 80.0), run("autoscaling from 1", 40.0)])
    assert "| autoscaling from 1 | 1 -> 2 | 2 | - | 15.0 | 10.0 | 40.0 | -50 % | 1000, 1600, - |" in table
    assert "Least worker-time among the static runs: static 1 (50.0 worker-s)" in table
    stragglers = straggler_table([run("straggler-free, 2 workers", 30.0, 10.0), run("~2x straggler, no policy", 50.0, 21.0)])
    assert "| ~2x straggler, no policy | 26.0 | 21.0 | +110 % | 50.0 | 1 -> 2 | - |" in stragglers


def test_bad_arguments_name_the_option():
    with pytest.raises(SystemExit):
        parse_args(["--experiments", "efficient-size,speed"])
    assert parse_args(["--quick"]).samples == 700_000
