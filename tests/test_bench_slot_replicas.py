"""benchmarks/slot_replicas: the harness end to end at toy size (one strategy, one job per setting).

It must print a row with both settings' step times and their ratio, from
real elastic jobs, and refuse settings that leave nothing to time.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, worker_env

from benchmarks.slot_replicas.run import parse_args


@pytest.mark.parametrize("staleness", [[], ["--staleness", "1"]])
def test_benchmark_smoke(tmp_path, staleness):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.slot_replicas", "--strategies", "PS", "--optimizers",
                           "momentum", "--hidden", "16", "--steps", "14", "--skip", "8", "--rounds", "1",
                           "--json", str(tmp_path / "out.json"), *staleness],
                          check=False, cwd=REPO_ROOT, env=worker_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    row = re.search(r"^\| PS \| momentum \| ([0-9.]+) ms \| ([0-9.]+) ms \| ([0-9.]+) \|$", proc.stdout, re.MULTILINE)
    assert row is not None, proc.stdout
    with_s, without_s, ratio = (float(x) for x in row.groups())
    assert with_s > 0 and without_s > 0 and ratio == pytest.approx(with_s / without_s, rel=0.03)  # the ms are rounded to 0.01
    assert (tmp_path / "out.json").exists()


def test_settings_that_time_nothing_are_refused():
    for argv in (["--np", "1"], ["--steps", "10", "--skip", "9"], ["--rounds", "0"]):
        with pytest.raises(SystemExit):
            parse_args(argv)
