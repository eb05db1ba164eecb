"""benchmarks/auto_probe: its summary of a run's calls, and its smallest configuration end to end.

The end-to-end run is the real benchmark (two network namespaces joined by a
``tc`` link, 4 ranks of the runtime alone) on a 1 MiB tensor over a 1 Gbit/s
link: it checks that every run finished and is reported, that the run without
a probe measured nothing, and that the run without pruning dropped no
candidate. Not timings or which topology wins: that is what the benchmark
measures, not what a test may assume. Needs root, as CI runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.auto_probe.run import AUTO_RUNS, FIXED, summarize
from benchmarks.harness.paths import REPO


def test_the_steady_state_is_the_median_of_the_last_calls_and_the_rest_is_the_probes_cost():
    s = summarize([3.0, 2.0, 2.0, 1.0, 1.0, 1.2, 0.9, 1.0])
    assert s["steady_s"] == 1.0  # the median of the last 5
    assert s["total_s"] == pytest.approx(12.1)
    assert s["probe_cost_s"] == pytest.approx(12.1 - 8 * 1.0)


def test_smallest_configuration_end_to_end(tmp_path):
    out = tmp_path / "auto_probe.json"
    cmd = [sys.executable, "-m", "benchmarks.auto_probe", "--bytes", str(1 << 20), "--calls", "20",
           "--rounds", "1", "--rate", "1gbit", "--json", str(out)]  # fmt: skip
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
        ),
    )
    done = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = json.loads(out.read_text())["runs"]
    assert sorted(runs) == sorted(list(AUTO_RUNS) + list(FIXED))
    for name in runs:
        assert len(runs[name]) == 1
        assert f"| {name} |" in done.stdout
        assert len(runs[name][0]["samples"]) == 20
    # No probe: AUTO stays on the size rule and measures nothing.
    assert runs["AUTO, fixed rule"][0]["auto_choice"] == ""
    assert runs["AUTO, fixed rule"][0]["probe_log"] == []
    for name in ("AUTO", "AUTO, no pruning"):
        rec = runs[name][0]
        assert rec["auto_choice"] in ("",) + FIXED
        # One probe: one line on rank 0, printed when it decided (it may still be deciding as the last call ends).
        assert len(rec["probe_log"]) <= 1
        if rec["auto_choice"]:
            assert len(rec["probe_log"]) == 1
    assert not any(
        "pruned" in line for line in runs["AUTO, no pruning"][0]["probe_log"]
    )
