"""builders.Auto in Keras ``fit`` and where it cannot search, with real workers (kungfu-run, np = 2).

tests/workers/auto_fit.py:

* ``fit`` with ``kungfu_tf.keras.AutoSearchCallback``: the search runs on
  fit's batches (across an epoch's end), a broken candidate is scored and not
  fatal, every worker chooses the same strategy and trains on it, no batch is
  lost, and the weights equal one process's ``fit`` on the union batches;
  also from a ``tf.data`` input of unknown length, whose first epoch ends
  in the middle of a trial (the end of the input is no failed trial); and
  with ``steps_per_execution=2`` (a trial's step is one call of two batches);
* ``fit`` without the callback and a plain ``tf.function`` step stop with a
  StrategyError naming what to use, instead of training on the starting
  all-reduce strategy without a word (what they did before).

And the guide's ``fit`` example (docs/guide/synchronisation-strategies.md,
``train_auto_fit.py``) runs as written: every worker ends on the strategy
the search chose, with the same weights (the same accuracy on the whole
digits set, to 4 decimals), and the model learned (>= 0.9; chance is 0.1).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT, assert_job_ok, run_job, worker_env
from test_readme_quickstart import BLOCK

GUIDE = REPO_ROOT / "docs" / "guide" / "synchronisation-strategies.md"


@pytest.mark.parametrize("mode", ["fit", "fit-dataset", "fit-steps-per-execution"])
def test_fit_searches_on_its_batches_and_trains_like_one_process(tmp_path, mode):
    log = tmp_path / "search.jsonl"
    rc, out, err = run_job(2, "auto_fit.py", mode, log, timeout=300)
    assert_job_ok(rc, out, err, 2, expected_checks=15)
    chosen = {line.split("] ", 1)[1] for line in out.splitlines() if "] chose " in line}
    assert len(chosen) == 1, out[-3000:]  # every worker names the same strategy
    assert out.count("kungfu auto: trial") == 4, out[-3000:]  # the progress lines, rank 0 only
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["measured_seconds"] is None for x in lines] == [False, True, False, False], lines


@pytest.mark.parametrize("mode, names", [
    ("fit-without-callback", "AutoSearchCallback"),
    ("tf-function", "kungfu_tf.elastic.function"),
])  # fmt: skip
def test_a_step_the_search_never_sees_is_refused_with_what_to_use(tmp_path, mode, names):
    rc, out, err = run_job(2, "auto_fit.py", mode, tmp_path / "search.jsonl", timeout=300)
    assert_job_ok(rc, out, err, 2, expected_checks=1)
    assert out.count("] refused: ") == 2 and names in out, out[-3000:]


def test_the_guides_fit_example_runs_as_written(tmp_path):
    blocks = {m.group(1): m for m in BLOCK.finditer(GUIDE.read_text(encoding="utf-8"))}
    block = blocks["train_auto_fit.py"]
    (tmp_path / "train_auto_fit.py").write_text(f"# train_auto_fit.py: {block.group(2)}\n{block.group(3)}")
    assert block.group(2) == "kungfu-run -np 2 python train_auto_fit.py"
    launcher = str(Path(sys.executable).with_name("kungfu-run"))
    res = subprocess.run([launcher, "-np", "2", sys.executable, "train_auto_fit.py"], cwd=tmp_path, env=worker_env(),
                         capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    report = f"exit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n--- stderr\n{res.stderr[-4000:]}"
    assert res.returncode == 0, report
    found = re.findall(r"^\[(\d)\] rank \1: accuracy ([\d.]+) with '([^']+)'$", res.stdout, re.MULTILINE)
    assert sorted(f[0] for f in found) == ["0", "1"], report
    assert len({f[2] for f in found}) == 1, report  # every worker trains on the strategy the search chose
    accuracies = {f[1] for f in found}
    assert len(accuracies) == 1 and float(accuracies.pop()) >= 0.9, report  # identical weights, and it learned
    assert res.stdout.count("kungfu auto: trial") == 4, report
