"""benchmarks/step_completion: its smallest configuration end to end (real workers), not its timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from benchmarks.harness.paths import REPO


def test_smallest_configuration_end_to_end(tmp_path):
    out = tmp_path / "step_completion.json"
    cmd = [sys.executable, "-m", "benchmarks.step_completion", "--np", "2", "--models", "16", "--rounds", "2",
           "--steps", "3", "--json", str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    [row] = json.loads(out.read_text())["rows"]
    assert (row["np"], row["hidden"], row["strategy"]) == (2, [16], "PS")
    assert [len(row["blocks"][k]) for k in ("with", "without")] == [2, 2]
    assert row["with_s"] > 0 and row["without_s"] > 0
    assert "| 2 | 64-16-10 |" in done.stdout, done.stdout
