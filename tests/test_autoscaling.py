"""AutoscalingPolicy end to end: a real elastic job finds its known efficient size (models/autoscale_train.py).

The job's throughput curve is fixed by construction, not by the CPU: every
step of every worker is padded to ``max(T, size * B / R)`` seconds
(``--pace-step-ms T --pace-rate R``, with T = 200 ms and R = 2 B / T), so the
job trains ``min(size * B / T, R)`` samples/s: 1 worker B/T, 2 workers 2B/T,
3 workers still 2B/T. The scaling efficiency is then s(1->2) = 1 and
s(2->3) = 0 on an idle and a loaded machine alike (a step's own work, a
small MLP on 256 samples, takes a few ms of the 200-300 ms period). Before,
a cgroup CPU quota set the efficient size and the host's scheduler and load
moved the verdict (it visited 1, 2, 3 and stayed at 3 on an idle machine).
Started at 1 worker with ``--max-np 3``, the policy (K = 1, N = 10 steps,
S = 0.5, midway) must visit 1, 2, 3 and settle at 2; the job ends 20 steps
after it has settled there (``--after-settled``), however long the joiners
took to start.

One run, checked against the records every worker wrote:

* the sizes visited, in order: 1, 2, 3, 2, and the job ends at 2;
* the decisions: the logged efficiencies s(1->2) > S and s(2->3) <= S, and the
  same verdicts from throughputs computed here from the step records over the
  steps the policy says it measured (an independent measurement and formula);
* every step was trained once by exactly ``size`` workers with ranks
  0..size-1, the samples advance by ``size * batch`` per step, and after every
  step all workers held the same weights (the sum of the weights each recorded);
* the workers that finished hold identical final weights (consensus and
  SHA-256), the worker removed at 3 -> 2 left cleanly (exit 0, a detached end).

No root, no cgroup: the test runs wherever CI runs.
"""

from __future__ import annotations

import re

from autoscale_records import (
    decisions,
    load,
    of,
    scaling_efficiency,
    size_runs,
    step_ends,
    step_sizes,
    steps_by_index,
)
from conftest import REPO_ROOT, describe, finish_job, start_job

SCRIPT = REPO_ROOT / "models" / "autoscale_train.py"
# The known-size job: steps padded to max(200 ms, size * B / R) with R = 2 B / 200 ms: the efficient size is 2.
BATCH, HIDDEN, STEP_MS, THRESHOLD, AFTER_SETTLED = 256, 64, 200, 0.5, 20
RATE = 2 * BATCH / (STEP_MS / 1000)
MEASURED = re.compile(r"measuring (\d+) workers.* over steps (\d+)\.\.(\d+)")
LOGGED_EFFICIENCY = re.compile(r"efficiency s\((\d+)->(\d+)\) = ([-\d.e+]+) (>|<=) S")


def window_throughput(records: list[dict], first: int, last: int) -> float:
    """Aggregate samples/s over steps first..last (inclusive), from the step records alone."""
    ends, steps = step_ends(records), steps_by_index(records)
    samples = steps[last][0]["samples"] - steps[first - 1][0]["samples"]
    return samples / (ends[last] - ends[first - 1])


def test_autoscaling_finds_the_efficient_size(tmp_path):
    record = tmp_path / "record.jsonl"
    args = ["--policy", "autoscaling", "--after-settled", AFTER_SETTLED, "--batch-size", BATCH, "--hidden", HIDDEN,
            "--pace-step-ms", STEP_MS, "--pace-rate", RATE, "--scale-every", 10, "--scale-by", 1,
            "--efficiency-threshold", THRESHOLD, "--record", record]  # fmt: skip
    proc = start_job(1, SCRIPT, *args, extra_launcher_args=["--elastic", "--min-np", "1", "--max-np", "3"])
    rc, out, err = finish_job(proc, timeout=600)
    assert rc == 0, describe(rc, out, err)
    assert "identical weights on all workers: True" in out, describe(rc, out, err)
    records = load(record)
    log = decisions(records)

    # The sizes visited: up while it pays, one step back, settled.
    runs = size_runs(step_sizes(records))
    assert [size for size, _, _ in runs] == [1, 2, 3, 2], (runs, log)

    # The policy's verdicts, and the same verdicts from our own measurement of its windows.
    logged = {(int(a), int(b)): float(s) for a, b, s, _ in (LOGGED_EFFICIENCY.search(x).groups() for x in log
                                                               if LOGGED_EFFICIENCY.search(x))}  # fmt: skip
    assert logged[(1, 2)] > THRESHOLD >= logged[(2, 3)], log
    windows = {int(k): (int(a), int(b)) for k, a, b in (MEASURED.search(x).groups() for x in log if MEASURED.search(x))}
    assert sorted(windows) == [1, 2, 3], log
    rate = {k: window_throughput(records, *w) for k, w in windows.items()}
    ours = {(1, 2): scaling_efficiency(1, rate[1], 2, rate[2]), (2, 3): scaling_efficiency(2, rate[2], 3, rate[3])}
    assert ours[(1, 2)] > THRESHOLD >= ours[(2, 3)], (rate, ours, logged)

    # Every step once, by exactly its workers, all in sync after it.
    steps = steps_by_index(records)
    assert list(steps) == list(range(len(steps)))
    previous = 0
    for step, rows in steps.items():
        size = rows[0]["size"]
        assert sorted(r["rank"] for r in rows) == list(range(size)), (step, rows)
        assert {r["samples"] for r in rows} == {previous + size * BATCH}, (step, rows)
        assert len({r["checksum"] for r in rows}) == 1, (step, [r["checksum"] for r in rows])
        previous += size * BATCH
    assert runs[-1][2] >= AFTER_SETTLED, runs  # ended --after-settled steps after settling at 2, not sooner

    ends = of(records, "end")
    members = [e for e in ends if not e["detached"]]
    assert len(members) == 2 and len({e["weights_sha256"] for e in members}) == 1, ends
    assert {e["step"] for e in members} == {len(steps)}, ends
    left = [e for e in ends if e["detached"]]
    assert len(left) == 1, ends  # the third worker, removed at 3 -> 2
    assert "failed with exit code" not in err, describe(rc, out, err)
