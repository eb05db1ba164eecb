"""benchmarks/autoscaling/run.py and tests/autoscale_records.py on made-up records whose numbers are known by
construction (no jobs: the end-to-end run is tests/test_autoscaling.py).
"""

from __future__ import annotations

import json

import pytest
from autoscale_records import (
    load,
    scaling_efficiency,
    size_runs,
    step_sizes,
    throughput_by_size,
)

from benchmarks.autoscaling.run import (
    Run,
    efficient_size_table,
    own_pace,
    parse_args,
    replacement_phases,
    straggler_losses,
    straggler_table,
)


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
    assert "| ~2x straggler, no policy | - | 26.0 | 21.0 | +110 % | - | 50.0 | 1 -> 2 | - | - |" in stragglers


def test_straggler_replacement_phases_and_the_time_lost_in_each():
    """A made-up replacement: straggler-free pace 400 samples/s (2 x 100 samples per 0.5 s step). With the
    straggler the steps take 1 s: 4 of them until the request (4 s for 800 samples, 2 s at the free pace: 2 s
    lost), 6 while the replacement starts (6 s for 1200: 3 s lost), 1 at 3 workers before the straggler
    leaves (1 s for 300: 0.25 s lost), then 10 at the free pace (nothing lost)."""
    records = made_up([(2, 4, 1.0), (2, 6, 1.0), (3, 1, 1.0), (2, 10, 0.5)])
    records += [
        {"event": "decision", "name": "log", "t": 1002.0, "text": "straggler check"},
        {"event": "decision", "name": "size", "old": 2, "new": 3, "t": 1004.0, "text": "size 2 -> 3 pending"},
        {"event": "change", "t": 1010.0, "old_size": 2, "new_size": 3},  # two workers record the same change
        {"event": "change", "t": 1010.05, "old_size": 2, "new_size": 3},
        {"event": "change", "t": 1011.0, "old_size": 3, "new_size": 2},
    ]
    phases = replacement_phases(records)
    assert phases == pytest.approx({"request_s": 4.0, "request_samples": 800, "join_s": 10.0, "join_samples": 2000,
                                    "removal_s": 11.0, "removal_samples": 2300})  # fmt: skip
    assert replacement_phases(made_up([(2, 5, 0.5)])) == {}  # no request, no phases
    free = Run(name="straggler-free, 2 workers", ok=True, completion_s=8.0, training_s=5.0, worker_s=10.0,
               final_size=2, sizes=[2], settle_s=None, throughput={}, samples=2000)  # fmt: skip
    policy = Run(name="~2x straggler, StragglerPolicy", ok=True, completion_s=20.0, training_s=16.0, worker_s=40.0,
                 final_size=2, sizes=[2, 3, 2], settle_s=None, throughput={}, samples=4300, phases=phases,
                 load=3.25)  # fmt: skip
    assert own_pace(policy) == pytest.approx(1 / 400)  # 5 s for the 2000 samples after the removal
    lost = straggler_losses(policy, free.training_s / free.samples)
    assert lost == pytest.approx({"detection": 2.0, "start-up": 3.0, "removal": 0.25, "after": 0.0})
    assert sum(lost.values()) == pytest.approx(16.0 - 4300 / 400)  # all of it: training time - free time
    # a loaded machine: after the removal the run trains at 1/200 s per sample; its own pace says what it lost
    assert straggler_losses(policy, 1 / 200) == pytest.approx({"detection": 0.0, "start-up": 0.0, "removal": -0.5,
                                                                "after": -5.0})  # fmt: skip
    shorter = Run(name="~2x straggler, no policy", ok=True, completion_s=9.0, training_s=5.0, worker_s=10.0,
                  final_size=2, sizes=[2], settle_s=None, throughput={}, samples=1000)  # fmt: skip
    table = straggler_table([free, policy, shorter])
    # per sample: 5 s for 1000 samples against 5 s for 2000 is +100 %; 16 s for 4300 is +49 %, 13 s (without the
    # 3 s start-up loss) +21 %
    assert "| ~2x straggler, no policy | 0.001 M | 9.0 | 5.0 | +100 % | - | 10.0 | 2 | - | - |" in table
    assert "| ~2x straggler, StragglerPolicy | 0.0043 M | 20.0 | 16.0 | +49 % | +21 % | 40.0 | 2 -> 3 -> 2 | 3.2 | -" in table
    # 5.25 s lost in all, against 10.75 s for the 4300 samples at the run's own pace: +48.8 %
    assert "| ~2x straggler, StragglerPolicy | 4.0 | - | 10.0 | 11.0 | 6.0 | 2.0 | 3.0 | 0.2 | 5.2 | +48.8 % |" in table
    # a replacement that never joined: no phase row, no exclusion
    stuck = Run(**{**policy.__dict__, "phases": {"request_s": 4.0, "request_samples": 800}})
    assert own_pace(stuck) is None
    assert "| ~2x straggler, StragglerPolicy | 0.0043 M | 20.0 | 16.0 | +49 % | - |" in straggler_table([free, stuck])


def test_bad_arguments_name_the_option():
    with pytest.raises(SystemExit):
        parse_args(["--experiments", "efficient-size,speed"])
    quick = parse_args(["--quick"])
    assert (quick.samples, quick.straggler_samples, quick.no_policy_samples) == (700_000, 3_000_000, 600_000)
    assert parse_args(["--no-policy-samples", "0"]).no_policy_samples == 0
