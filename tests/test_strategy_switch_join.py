"""A worker admitted after a strategy switch runs the switched strategy (issue 24 §2).

models/elastic_train.py with ``kungfu-run --elastic --max-np 3``, Keras optimizers that build their slots
lazily at the first step, in a ``kungfu_tf.elastic.function`` loop:

* 2 workers start on PS with Adam (two slots per variable), switch to AllReduce after step 3 (the owner's slots become every worker's
  replicas) and grow to 3 after step 6: the joiner must build AllReduce, not the PS the script starts with;
* 2 workers start on AllReduce, switch to PartitionedPS after step 3 (every kernel cut, the shards' slots
  go to their owners) and grow to 3 after step 6 (the shards re-partition over 3 owners, one the joiner);
  the same with PartitionedPS written in a file (the members re-map its owners and send it to the joiner,
  whose script started with a builder);
* 3 workers start on PS with Adam (its slots live on the owners), switch to AllReduce after step 3 (the
  slots become every worker's replicas), the worker of rank 2 is SIGKILLed as step 6 begins and the job
  grows back to 3 after step 8 (the launcher's replacement joins after the switch). Adam's bias
  correction reads the step counter: the survivors once counted the failed step 6 before running it
  again, and missed the reference (StrategyPlan._completed_everywhere).

Before the strategy in force travelled to joiners, the joiner re-built the strategy the script started
with while the members re-built the switched one: the consensus on the strategy bytes failed at every
admission (``StrategyError`` on every worker) and the job died. Checked: the job ends well, the final
workers hold identical weights and slots, and both equal one process trained with the same optimizer on the
union of each step's batches (tests/elastic_records.py).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import describe, run_job
from elastic_records import (
    MODELS,
    final_slots,
    final_weights,
    load,
    reference_training,
    steps_by_index,
)
from test_elastic_strategy import written_strategy

SAMPLES, BATCH, HIDDEN, LR, STEPS = 96, 4, 8, 0.01, 12
LAUNCHER = ["--elastic", "--max-np", "3"]


def train_args(tmp_path, strategy: str, optimizer: str) -> list[object]:
    return ["--api", "function", "--strategy", strategy, "--optimizer", optimizer, "--samples", SAMPLES,
            "--batch-size", BATCH, "--hidden", HIDDEN, "--lr", LR, "--steps", STEPS, "--epochs", 10,
            "--record-dir", tmp_path / "records", "--record-slots"]  # fmt: skip


def reference_slots(opt) -> list[list[np.ndarray]]:
    """``slots[kind][variable]`` of the one-process optimizer, in the order the wrapped one makes them."""
    if isinstance(opt, keras.optimizers.Adam):
        return [[m.numpy() for m in opt._momentums], [v.numpy() for v in opt._velocities]]
    return [[m.numpy() for m in opt.momentums]]  # SGD with momentum


def check_like_one_process(tmp_path, rc: int, out: str, err: str, sizes: list[int], switch: tuple[int, str, str],
                           optimizer: str) -> None:  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    records = load(tmp_path / "records")
    by_step = steps_by_index(records)
    assert sorted(by_step) == list(range(STEPS)), report
    assert [len(by_step[s]) for s in range(STEPS)] == sizes, report
    switches = {(r["step"], r["old"], r["new"]) for lines in records.values() for r in lines if r["event"] == "switch"}
    assert switches == {switch}, report
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    finals = sorted(stem for stem, end in ends.items() if not end["detached"])
    assert len(finals) == 3, report
    first_steps = [min(r["step"] for r in records[stem] if r["event"] == "step") for stem in finals]
    assert max(first_steps) > switch[0], f"no final worker joined after the switch: first steps {first_steps}\n{report}"
    assert len({ends[s]["weights_sha256"] for s in finals}) == 1, report
    assert len({ends[s]["state_sha256"] for s in finals}) == 1, report  # model and optimizer variables
    assert len({ends[s]["slots_sha256"] for s in finals}) == 1, report
    model, opt = reference_training(by_step, SAMPLES, HIDDEN, LR, optimizer)
    want_slots = reference_slots(opt)
    for stem in finals:
        for got, want in zip(final_weights(tmp_path / "records", stem), model.trainable_weights, strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{stem}: weights")
        got_slots = final_slots(tmp_path / "records", stem)
        assert [len(kind) for kind in got_slots] == [len(kind) for kind in want_slots], stem
        for kind, (got_kind, want_kind) in enumerate(zip(got_slots, want_slots)):
            for got, want in zip(got_kind, want_kind):
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=f"{stem}: slot kind {kind}")


@pytest.mark.parametrize(
    ("start", "switched"),
    [("PS", "AllReduce"), ("AllReduce", "PartitionedPS"), ("AllReduce", "written")],
    ids=["ps-to-ar", "ar-to-pps", "ar-to-written"],
)
def test_a_joiner_after_a_switch_runs_the_switched_strategy(tmp_path, start, switched):
    target = written_strategy(tmp_path, workers=2) if switched == "written" else switched
    args = train_args(tmp_path, start, "adam") + ["--switch-at", f"3:{target}", "--resize-at", "6:3", "--resize-wait"]
    rc, out, err = run_job(2, MODELS / "elastic_train.py", *args, timeout=300, extra_launcher_args=LAUNCHER)
    new_id = "PartitionedPS" if switched == "written" else switched  # the file's strategy is that builder's
    check_like_one_process(tmp_path, rc, out, err, [2] * 6 + [3] * 6, (3, start, new_id), "adam")


def test_a_replacement_after_a_switch_runs_the_switched_strategy(tmp_path):
    args = train_args(tmp_path, "PS", "adam") + ["--switch-at", "3:AllReduce", "--crash-at", 6, "--crash-rank", 2,
                                     "--resize-at", "8:3", "--resize-wait"]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=300, extra_launcher_args=LAUNCHER)
    check_like_one_process(tmp_path, rc, out, err, [3] * 6 + [2] * 2 + [3] * 4, (3, "PS", "AllReduce"),
                           "adam")  # fmt: skip
