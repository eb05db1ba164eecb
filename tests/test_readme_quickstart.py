"""README.md's quick start, executed as written: every script, each with the command in its first line.

The README shows ``train.py`` (Keras ``fit`` on 4 workers), ``train_elastic.py`` (the same model
under ``elastic.run`` + ``elastic_fit``) and ``train_auto.py`` (a custom loop on 2 workers whose
strategy ``builders.Auto`` searches), each opening with ``# NAME: COMMAND``. The test takes each
code block out of the README, writes it to NAME and runs COMMAND, ``kungfu-run`` and ``python`` being
this checkout's. Checked: every worker ends with the same weights (it prints the same accuracy on the
whole data set, to 4 decimals) and the model learned (>= 0.9 on the digits, chance being 0.1); the
elastic job ends at the step count of one epoch-exact run (10 epochs of 1797 samples at 32 per worker).
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, worker_env

BLOCK = re.compile(r"^```python\n# (\w+\.py): (.+?)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_scripts() -> dict[str, tuple[str, str]]:
    """name -> (command, whole code block) of every README block that opens with ``# NAME: COMMAND``."""
    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    return {m.group(1): (m.group(2), f"# {m.group(1)}: {m.group(2)}\n{m.group(3)}") for m in BLOCK.finditer(text)}


def run_as_written(tmp_path: Path, name: str) -> subprocess.CompletedProcess:
    command, code = readme_scripts()[name]
    (tmp_path / name).write_text(code)
    argv = shlex.split(command)
    assert argv[0] == "kungfu-run" and "python" in argv, command
    launcher = Path(sys.executable).with_name("kungfu-run")
    argv = [str(launcher), *(sys.executable if a == "python" else a for a in argv[1:])]
    return subprocess.run(argv, cwd=tmp_path, env=worker_env(), capture_output=True, text=True, timeout=600, check=False)


def test_the_readme_shows_the_three_scripts():
    assert set(readme_scripts()) == {"train.py", "train_elastic.py", "train_auto.py"}


@pytest.mark.parametrize(("name", "line", "workers"), [
    ("train.py", r"^\[(\d)\] rank \1: accuracy ([\d.]+)$", 4),
    ("train_elastic.py", r"^\[(\d)\] step (\d+): accuracy ([\d.]+)$", 4),
    ("train_auto.py", r"^\[(\d)\] rank \1: accuracy ([\d.]+) with '([^']+)'$", 2),
])  # fmt: skip
def test_readme_script_runs_as_written(tmp_path, name, line, workers):
    res = run_as_written(tmp_path, name)
    report = f"exit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n{res.stderr[-4000:]}"
    assert res.returncode == 0, report
    found = re.findall(line, res.stdout, re.MULTILINE)
    assert len(found) == workers, report
    accuracies = {f[1] if name == "train_auto.py" else f[-1] for f in found}
    if name == "train_auto.py":
        assert len({f[2] for f in found}) == 1, report  # every worker trains on the strategy the search chose
    assert len(accuracies) == 1 and float(accuracies.pop()) >= 0.9, report  # identical weights, and it learned
    if name == "train_elastic.py":
        steps = {int(f[1]) for f in found}
        assert steps == {10 * math.ceil(1797 / (32 * workers))}, report
