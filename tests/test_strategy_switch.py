"""Switching the strategy mid-run (issue 24 §2): ``switch_strategy`` and ``StrategyPolicy`` with real workers.

tests/workers/strategy_switch.py at np = 3 (``kungfu-run``): Adam (two slots per variable, built lazily)
switched PS -> AllReduce -> PartitionedPS in a ``kungfu_tf.elastic.function`` loop, in Keras ``fit`` (a
callback) and by a ``StrategyPolicy`` (injected scores), each reaching the weights of one process trained on
the union batches; the refusals (workers asking for different strategies, an unknown builder on every worker
and on one, a strategy for other variables) raise the same precise error on every worker with nothing
changed. Before switch_strategy existed there was no way to change a strategy without restarting.
"""

from __future__ import annotations

import numpy as np
from conftest import assert_job_ok, describe, rank_lines, run_job
from elastic_records import (
    MODELS,
    final_weights,
    load,
    reference_weights,
    steps_by_index,
)

LAUNCHER = ["--elastic", "--max-np", "3"]

RUNS = ("function", "refusals", "fit", "policy", "cost-model")


def test_switches_train_like_one_process_and_refusals_change_nothing():
    rc, out, err = run_job(3, "strategy_switch.py", timeout=300)
    counts = assert_job_ok(rc, out, err, 3)
    lines = rank_lines(out)
    for rank in range(3):
        ran = [line.split()[1] for line in lines[rank] if line.startswith("ran ")]
        assert ran == list(RUNS), (rank, ran)
        refusals = [line for line in lines[rank] if line.startswith("refusal/")]
        assert len(refusals) == 4, refusals
        assert counts[rank] > 30


def test_a_resize_then_switches_train_like_one_process(tmp_path):
    # models/elastic_train.py: 3 workers, PSLoadBalancing with Adam; a shrink to 2 after step 4 (the leaving
    # owner hands its slots over), then switches after steps 6 (-> AllReduce: the owners' slots become every
    # worker's replicas) and 9 (-> PartitionedPS: the 1100-wide first kernel, 281 KB, is cut in 2 shards whose
    # slots go to their owners). The final weights equal one process on the union of each step's batches.
    samples, batch, hidden, lr, steps = 96, 4, 1100, 0.01, 12
    args = ["--api", "function", "--strategy", "PSLoadBalancing", "--optimizer", "adam", "--samples", samples,
            "--batch-size", batch, "--hidden", hidden, "--lr", lr, "--steps", steps, "--epochs", 10,
            "--record-dir", tmp_path / "records", "--resize-at", "4:2", "--switch-at", "6:AllReduce,9:PartitionedPS"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=240, extra_launcher_args=LAUNCHER)
    report = describe(rc, out, err)
    assert rc == 0, report
    records = load(tmp_path / "records")
    by_step = steps_by_index(records)
    assert sorted(by_step) == list(range(steps)), report
    assert [len(by_step[s]) for s in range(steps)] == [3] * 4 + [2] * 8, report
    switches = sorted({(r["step"], r["old"], r["new"], r["size"]) for lines in records.values() for r in lines
                       if r["event"] == "switch"})  # fmt: skip
    assert switches == [(6, "PSLoadBalancing", "AllReduce", 2), (9, "AllReduce", "PartitionedPS", 2)], report
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    finals = [stem for stem, end in ends.items() if not end["detached"]]
    assert len(finals) == 2 and len({ends[s]["weights_sha256"] for s in finals}) == 1, report
    reference = reference_weights(by_step, samples, hidden, lr, "adam")
    for got, want in zip(final_weights(tmp_path / "records", finals[0]), reference):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
