"""builders.Auto, its trials and ``kungfu-strategy search`` with real workers (kungfu-run, np = 2).

* tests/workers/auto_trials.py: a trial that failed on one worker (in its
  switch or in a step) fails on every worker after the same steps; the
  measured time is the slowest worker's, the same number everywhere;
  workers holding different candidates stop with a StrategyError.
* tests/workers/auto_equivalence.py: a job whose first steps are the trials
  of ``Auto(budget=4)`` (the starting all-reduce, a broken candidate whose
  switch fails on every worker, and sampled candidates) ends with the
  weights of one process trained on the union batches; the search log has a
  prediction for every trial and a measurement for every one but the broken.
* ``kungfu-strategy search`` writes a strategy that ``explain`` accepts for
  the model, and a log with predicted and measured times per trial; bad
  input is one precise line before any worker starts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import REPO_ROOT, assert_job_ok, describe, run_job, worker_env
from elastic_records import final_weights, load, reference_weights, steps_by_index
from test_elastic_strategy import (
    HIDDEN,
    LAUNCHER,
    LR,
    MODELS,
    SAMPLES,
    STEPS,
    check_trained_like_one_process,
    train_args,
)

from kungfu_tf.strategy import format as strategy_format


def test_trials_agree_on_failure_measurement_and_candidate():
    rc, out, err = run_job(2, "auto_trials.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=9)


def test_training_through_auto_trials_equals_one_process(tmp_path):
    rc, out, err = run_job(2, "auto_equivalence.py", "auto", tmp_path / "search.jsonl", timeout=300)
    counts = assert_job_ok(rc, out, err, 2)
    assert counts[0] > counts[1] > 0, out[-3000:]  # rank 0 also checked the log
    assert out.count("kungfu auto: trial") == 4, out[-3000:]  # the progress lines, rank 0 only


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kungfu_tf.strategy.cli", *args],
        capture_output=True, text=True, timeout=600, env=worker_env(), cwd=REPO_ROOT, check=False,
    )  # fmt: skip


def test_search_writes_a_strategy_explain_accepts_and_a_log(tmp_path):
    best, log = tmp_path / "best.pbtxt", tmp_path / "search.jsonl"
    r = cli("search", "--model", "digits-mlp", "--np", "2", "--budget", "3", "--trial-steps", "2",
            "--warmup", "1", "-o", str(best), "--log", str(log))  # fmt: skip
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("kungfu auto: trial") == 3 and f"wrote {best}" in r.stdout, r.stdout
    strategy = strategy_format.load(best)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["confirmation"] for x in lines] == [False] * 3 + [True] * 2, lines  # the 2 fastest once more
    assert r.stdout.count("kungfu auto: confirmation") == 2, r.stdout
    times: dict[str, list[float]] = {}
    for x in lines:
        assert x["predicted_seconds"] > 0 and x["measured_seconds"] > 0 and 0 <= x["waited_steps"] <= 10, x
        times.setdefault(x["strategy_id"], []).append(x["measured_seconds"])
    fastest_two = sorted(times, key=lambda i: times[i][0])[:2]
    assert sorted(x["strategy_id"] for x in lines[3:]) == sorted(fastest_two), lines
    assert strategy.id == min(times, key=lambda i: sum(times[i]) / len(times[i]))  # the lowest mean
    explained = cli("explain", str(best), "--model", "digits-mlp", "--np", "2")
    assert explained.returncode == 0, explained.stderr
    assert "dense" in explained.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--np", "1"], "needs at least 2 workers"),
        (["--np", "2", "--budget", "0"], "argument --budget: must be >= 1, got 0"),
        (["--np", "2", "--hosts", "3"], "cannot spread 2 replicas over 3 hosts"),
        (["--np", "2", "--warmup", "-1"], "--warmup must be >= 0 steps, got -1"),
        (["--np", "2", "--confirm-top", "1"], "--confirm-top must be 0 (none) or >= 2"),
    ],
)
def test_search_bad_input(tmp_path, args, message):
    r = cli("search", "--model", "digits-mlp", *args, "-o", str(tmp_path / "best.pbtxt"))
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "best.pbtxt").exists()


def test_search_of_a_model_without_trainable_variables(tmp_path):
    (tmp_path / "registry.py").write_text(
        textwrap.dedent(
            """\
            import keras
            from types import SimpleNamespace

            def frozen():
                model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
                model.trainable = False
                return model

            MODELS = {"frozen": SimpleNamespace(build=frozen)}
            """
        )
    )
    (tmp_path / "search_strategy.py").write_text("raise SystemExit('the search must not start')\n")
    r = cli("search", "--model", "frozen", "--np", "2", "--models-dir", str(tmp_path), "-o", str(tmp_path / "b.pbtxt"))
    assert r.returncode == 2, r
    assert r.stderr.strip().splitlines()[-1] == (
        "kungfu-strategy: error: the model has no trainable variables: there is no strategy to search for"
    )


def test_a_membership_change_during_the_search_ends_it_and_training_stays_exact(tmp_path):
    # models/elastic_train.py with strategy="Auto" (8 trials of 2 + 5 steps, and up to 10 more while AUTO probes:
    # step 12 is within the search), SGD with momentum: the job shrinks to 2 at step 12, mid-trial.
    # The search stops there on both survivors; the change re-built the strategy through Auto (not the candidate,
    # which was written for 3 replicas: the shrink refused it, and every worker died, before this was so).
    args = train_args(tmp_path, "Auto", "momentum") + ["--resize-at", "12:2"]
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=300, extra_launcher_args=LAUNCHER)
    check_trained_like_one_process(tmp_path, rc, out, err, [3, 3, 3, 3, 3, 2], "momentum")
    # How many trials ended before step 12 depends on how long each waited for AUTO's probes.
    assert re.search(r"the cluster changed during the search \(after [0-7] trials\)", err), err[-3000:]


def test_a_joiner_builds_the_searched_strategy_the_members_build(tmp_path):
    # A short search (Auto(budget=2), one warm-up and one timed step per trial) ends by step 6 on 3 workers.
    # At step 8 the job shrinks to 2 (no result for 2 workers: the all-reduce strategy), at step 12 it grows
    # back to 3: the members re-build their searched best for 3 workers, and the joiner, whose own Auto never
    # searched, must build the same. It took the members' result; before, it built the all-reduce strategy
    # alone, and the consensus on the strategy bytes failed at its admission whenever the best was another.
    args = train_args(tmp_path, "Auto", "momentum") + ["--auto-budget", 2, "--resize-at", "8:2,12:3", "--resize-wait"]
    out, _ = run_shrink_and_grow_back(tmp_path, args)
    # Every final worker, the joiner among them, holds the search's result and trains on its best.
    lines = re.findall(r"strategy '([^']*)' at 3 workers; Auto's results: (.*)", out)
    assert len(lines) == 3, out[-3000:]
    assert len({strategy for strategy, _ in lines}) == 1 and {r for _, r in lines} == {f"'{lines[0][0]}' for 3 workers"}, lines


def test_auto_searches_a_new_cluster_again_with_research_budget(tmp_path):
    # Auto(budget=2, research_budget=2): the first search ends by step 4; the shrink to 2 at step 6 starts a
    # search of two trials (the all-reduce strategy the change re-built, a sampled one) on the two workers,
    # over by step 10; the growth back to 3 at step 12 re-builds the first search's best (searched before: no
    # new search), on the joiner too, which took both results. The trials train as any steps: the weights are
    # one process's.
    args = train_args(tmp_path, "Auto", "momentum") + ["--auto-budget", 2, "--auto-research", 2,
                                                       "--resize-at", "6:2,12:3", "--resize-wait"]  # fmt: skip
    out, err = run_shrink_and_grow_back(tmp_path, args, shrink_at=6)
    assert len(re.findall(r"cluster v\d+ \(2 workers\) has not been searched: searching it again", err)) == 1, err[-3000:]
    assert "(3 workers) has not been searched" not in err, err[-3000:]
    lines = re.findall(r"strategy '([^']*)' at 3 workers; Auto's results: '([^']*)' for 3 workers, '([^']*)' for 2 "
                       r"workers\n", out)  # fmt: skip
    assert len(lines) == 3 and len(set(lines)) == 1 and lines[0][0] == lines[0][1], out[-3000:]


def run_shrink_and_grow_back(tmp_path, args: list[object], shrink_at: int = 8) -> tuple[str, str]:
    """np=3, shrink to 2 at ``shrink_at``, grow back to 3 at step 12: trained like one process (the final three
    alike)."""
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=300, extra_launcher_args=LAUNCHER)
    report = describe(rc, out, err)
    assert rc == 0, report
    records = load(tmp_path / "records")
    steps = steps_by_index(records)
    assert sorted(steps) == list(range(STEPS)), report
    assert [len(steps[s]) for s in (3, shrink_at - 1, shrink_at, 11, 12, 15)] == [3, 3, 2, 2, 3, 3], report
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    finals = [stem for stem, end in ends.items() if not end["detached"]]
    assert len(finals) == 3 and len({ends[s]["weights_sha256"] for s in finals}) == 1, report
    assert [ends[s]["optimizer_iterations"] for s in finals] == [[STEPS]] * 3, report
    for got, want in zip(final_weights(tmp_path / "records", finals[0]),
                         reference_weights(steps, SAMPLES, HIDDEN, LR, "momentum")):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return out, err
