"""StragglerPolicy with real workers: ``kungfu-run --elastic -np 2 --max-np 3``, one worker slowed by
construction (its forward pass waits 0.2 s every step, a few ms of work besides), in one job:

* the policy names the slowed worker and asks for a replacement;
* the replacement joins before the straggler leaves, and the cluster never has fewer than 2 workers;
* the straggler is evicted right after the first step the replacement ran with it (not at the next check);
* the straggler is evicted (``resize(workers=...)``), detaches and exits 0;
* the survivors (the original fast worker and the replacement) end with the same weights;
* the GradientMonitor's ``worker_compute_times`` holds each worker's own ``compute_time`` at its rank,
  with one entry per worker, at 2, 3 and again 2 workers (the per-rank values stay right across resizes).

Unit tests of the algorithm: tests/test_straggler_policy_units.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import describe, run_job

SLOW_RANK = 1
EVERY = 5
MAX_STEPS = 1000
JOB_TIMEOUT = 400
# The straggler's extra compute time per step. Algorithm 1's throughput fraction of the slowed worker is then
# 2c / (2c + SLOW_SECONDS) for a fast worker's compute time c: 0.05 at c = 5 ms, still 0.5 at c = 100 ms (a loaded
# machine), well below the policy's 0.8 either way. A CPU quota made it depend on how much CPU the fast worker got.
SLOW_SECONDS = 0.2


def load(record_dir: Path) -> dict[str, list[dict]]:
    """"host_port-pid" -> that worker's records."""
    return {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in sorted(record_dir.glob("*.jsonl"))}


def test_a_slowed_worker_is_replaced_first_then_evicted_and_the_size_never_drops(tmp_path):
    rc, out, err = run_job(
        2, "straggler_train.py", tmp_path, SLOW_SECONDS, SLOW_RANK, EVERY, MAX_STEPS,
        timeout=JOB_TIMEOUT,
        extra_launcher_args=["--elastic", "--max-np", "3", "--timeout", "60"],
    )  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    workers = load(tmp_path)
    assert len(workers) == 3, f"{sorted(workers)}\n{report}"
    ends = {name: records[-1] for name, records in workers.items()}
    assert all(end["event"] == "end" for end in ends.values()), report
    steps = {name: [r for r in records if r["event"] == "step"] for name, records in workers.items()}
    # who is who: the straggler was rank SLOW_RANK at step 0, the replacement is the joiner
    (slow,) = [n for n, s in steps.items() if s[0]["step"] == 0 and s[0]["rank"] == SLOW_RANK]
    (joiner,) = [n for n, e in ends.items() if e["joiner"]]
    (fast,) = [n for n in workers if n not in (slow, joiner)]
    peer_of = {n: s[0]["peers"][s[0]["rank"]] for n, s in steps.items()}

    # detected: the policy asked for a replacement of the slowed worker, then evicted it
    log = ends[fast]["log_lines"]
    asked = [line for line in log if "asked for a replacement" in line]
    assert asked and asked[0].split("straggler ")[1].startswith(peer_of[slow]), "\n".join(log)
    evicted = [line for line in log if line.startswith("step ") and " workers " in line and "evict straggler" in line]
    assert len(evicted) == 1 and "refused" not in evicted[0], "\n".join(log)
    assert ends[fast]["policy"]["replaced"] == 1 and ends[fast]["policy"]["pending"] is None, "\n".join(log)

    # the replacement joined before the straggler left; never fewer than 2 workers
    sizes = [(r["step"], r["size"]) for records in steps.values() for r in records]
    assert min(size for _, size in sizes) >= 2, sizes
    last_slow = steps[slow][-1]
    assert last_slow["size"] == 3 and peer_of[joiner] in last_slow["peers"], last_slow
    assert steps[joiner][0]["step"] <= last_slow["step"], (steps[joiner][0], last_slow)
    # evicted right after the first step it ran with its replacement, not at the next check (up to EVERY - 1
    # more steps at the straggler's pace)
    assert last_slow["step"] == steps[joiner][0]["step"], (steps[joiner][0], last_slow)
    assert all(peer_of[slow] not in r["peers"] and r["size"] == 2 for r in steps[fast] if r["step"] > last_slow["step"])
    assert steps[fast][-1]["step"] > last_slow["step"], "the survivors trained on after the eviction"

    # the straggler detached and exited 0 (the job's rc); the survivors stopped at the same step, same weights
    assert ends[slow]["detached"] is True and ends[fast]["detached"] is False and ends[joiner]["detached"] is False
    assert ends[fast]["step"] == ends[joiner]["step"], (ends[fast]["step"], ends[joiner]["step"])
    with np.load(tmp_path / f"{fast}.npz") as a, np.load(tmp_path / f"{joiner}.npz") as b:
        assert len(a.files) == 4
        for key in a.files:
            assert np.all(np.isfinite(a[key]))
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)

    # the monitor's per-rank compute times: one per worker, this worker's own value at its rank, at every size
    seen_sizes = set()
    for records in steps.values():
        for r in records:
            times = r["worker_compute_times"]
            assert len(times) == r["size"], r
            assert times[r["rank"]] == pytest.approx(r["compute_time"], rel=1e-6), r  # the rider rides as float32
            seen_sizes.add(r["size"])
    assert seen_sizes == {2, 3}
    # and the monitor saw the slowed worker's pause: its compute time includes SLOW_SECONDS every step
    slow_times = np.array([r["compute_time"] for r in steps[slow] if r["step"] > 2])
    assert len(slow_times) and np.all(slow_times >= SLOW_SECONDS), slow_times[:20]
