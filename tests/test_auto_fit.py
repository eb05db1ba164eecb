"""builders.Auto in Keras ``fit`` and where it cannot search, with real workers (kungfu-run, np = 2).

tests/workers/auto_fit.py:

* ``fit`` with ``kungfu_tf.keras.AutoSearchCallback``: the search runs on
  fit's batches (across an epoch's end), a broken candidate is scored and not
  fatal, every worker chooses the same strategy and trains on it, no batch is
  lost, and the weights equal one process's ``fit`` on the union batches;
* ``fit`` without the callback and a plain ``tf.function`` step stop with a
  StrategyError naming what to use, instead of training on the starting
  all-reduce strategy without a word (what they did before).
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_job_ok, run_job


def test_fit_searches_on_its_batches_and_trains_like_one_process(tmp_path):
    log = tmp_path / "search.jsonl"
    rc, out, err = run_job(2, "auto_fit.py", "fit", log, timeout=300)
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

