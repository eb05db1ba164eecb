"""Horovod's elastic semantics (the re-run mode of ``kungfu_tf.elastic.run``) with real workers.

Workers shaped like Horovod's TF2 elastic examples, module renamed only (tests/workers/horovod_elastic_*.py).
``kungfu-run --elastic -np 2 --min-np 1 --max-np 3``: the worker of rank 1 kills itself (SIGKILL) as a
step begins, one step after the last commit; the survivor's step fails, its values and weights roll
back to that commit and it trains alone; the launcher's replacement is admitted (by the config service,
or at the latest by ``resize(2, wait=True)``), then a third worker by ``resize(3, wait=True)``. Every
change enters the training function again on every member, after the reset callbacks ran with the new
size (the joiners', once admitted, too).

Verdicts read the records, not the clock: a change's step depends on the machine's speed, what each
change must do does not.

In-process tests of the states and callbacks: tests/test_elastic_rerun_units.py.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from conftest import describe, run_job, worker_path

LAUNCH = ["--elastic", "--min-np", "1", "--max-np", "3"]


def _records(record_dir: Path) -> dict[int, list[dict]]:
    return {int(p.stem): [json.loads(line) for line in p.read_text().splitlines()] for p in record_dir.glob("*.jsonl")}


def _committed_steps(records: dict[int, list[dict]]) -> dict[int, dict[int, dict]]:
    """step -> rank -> the step as committed (the same by every worker that committed it)."""
    out: dict[int, dict[int, dict]] = defaultdict(dict)
    for lines in records.values():
        for r in lines:
            for s in r.get("steps", []) if r["event"] == "commit" else []:
                seen = out[s["step"]].get(s["rank"])
                assert seen is None or seen == s, ("a step committed twice, differently", seen, s)
                out[s["step"]][s["rank"]] = s
    return dict(out)


def _reference(steps: dict[int, dict[int, dict]]) -> list[np.ndarray]:
    """One process: each committed step's SGD update at its learning rate, on the mean of the shares' gradients."""
    import keras
    import tensorflow as tf

    sys.path.insert(0, str(Path(worker_path("horovod_elastic_tf2.py")).parent))
    import horovod_elastic_tf2 as worker
    x, y = worker.make_data()
    model = worker.make_model()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for step in sorted(steps):
        shares = [s for _, s in sorted(steps[step].items())]
        assert len({s["lr"] for s in shares}) == 1 and len({s["size"] for s in shares}) == 1 == len({len(shares)}), shares
        assert shares[0]["size"] == len(shares), shares
        grads = None
        for s in shares:
            with tf.GradientTape() as tape:
                value = loss(y[s["ids"]], model(x[s["ids"]], training=True))
            g = tape.gradient(value, model.trainable_variables)
            grads = g if grads is None else [a + b for a, b in zip(grads, g)]
        for v, g in zip(model.trainable_variables, grads):
            v.assign_sub(shares[0]["lr"] * g / len(shares))
    return [w.numpy() for w in model.trainable_weights]


def test_custom_loop_rolls_back_on_a_crash_and_reruns_after_each_change(tmp_path):
    epochs = 3
    rc, out, err = run_job(2, "horovod_elastic_tf2.py", "--epochs", epochs, "--crash-at", 5, "--crash-rank", 1,
                           "--resize-at", "10:2,14:3", "--record-dir", tmp_path, timeout=150,
                           extra_launcher_args=LAUNCH)  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    records = _records(tmp_path)
    ends = {pid: lines[-1] for pid, lines in records.items() if lines[-1]["event"] == "end"}
    assert len(ends) == 3, (sorted(records), report)  # the survivor, the replacement, the third worker
    finals = {json.dumps({k: v for k, v in e.items() if k not in ("pid", "rank", "joiner")}, sort_keys=True)
              for e in ends.values()}  # fmt: skip
    assert len(finals) == 1, ends  # the same values, sampler position and weights everywhere
    end = next(iter(ends.values()))
    assert end["size"] == 3 and end["epoch"] == epochs, end

    # Exactly once: every sample of every epoch in the committed steps, steps numbered without gaps.
    steps = _committed_steps(records)
    assert sorted(steps) == list(range(end["step"])), sorted(steps)
    per_epoch: dict[int, list[int]] = defaultdict(list)
    for step in steps.values():
        for s in step.values():
            per_epoch[s["epoch"]].extend(s["ids"])
    assert sorted(per_epoch) == list(range(epochs))
    for epoch, ids in per_epoch.items():
        assert sorted(ids) == list(range(48)), (epoch, sorted(ids))
    # Steps 0-3 committed at size 2; step 4 ran at size 2, was rolled back, and ran again on the survivor alone.
    assert [len(steps[s]) for s in range(5)] == [2, 2, 2, 2, 1], {s: len(v) for s, v in steps.items()}

    survivor = next(pid for pid, e in ends.items() if not e["joiner"])
    lines = records[survivor]
    # Rollback: the step after the last commit was trained (step 4 -> 5), the crash failed step 5, and the
    # function was entered again with every value and the weights of that commit.
    enters = [i for i, r in enumerate(lines) if r["event"] == "enter"]
    assert len(enters) == 4, [r["event"] for r in lines]  # the start, the crash, the replacement, the grow
    after_crash = lines[enters[1]]
    before = lines[: enters[1]]
    last_commit = [r for r in before if r["event"] == "commit"][-1]
    assert [r["step"] for r in before if r["event"] == "trained"][-1] == 5, before
    keys = ("step", "batch", "epoch", "counter", "sampler", "weights")
    assert {k: after_crash[k] for k in keys} == {k: last_commit[k] for k in keys}, (after_crash, last_commit)
    assert after_crash["step"] == 4 and after_crash["counter"] == 40 and after_crash["size"] == 1, after_crash
    # Every later entry starts from the commit before it, too (interrupts raise after a commit).
    for i in enters[2:]:
        commit = [r for r in lines[:i] if r["event"] == "commit"][-1]
        assert {k: lines[i][k] for k in keys} == {k: commit[k] for k in keys}, (lines[i], commit)

    # Reset callbacks: after every change, with the new size, on every member (joiners once admitted).
    resets = {pid: [(r["size"], r["lr"]) for r in rs if r["event"] == "reset"] for pid, rs in records.items()}
    assert [s for s, _ in resets[survivor]] == [1, 2, 3], resets
    joiners = sorted((pid for pid, e in ends.items() if e["joiner"]), key=lambda pid: -len(resets[pid]))
    assert [[s for s, _ in resets[pid]] for pid in joiners] == [[2, 3], [3]], resets
    assert all(abs(lr - 0.05 * size) < 1e-7 for rs in resets.values() for size, lr in rs), resets
    for pid in joiners:  # entered once when admitted, once more per later change
        assert sum(r["event"] == "enter" for r in records[pid]) == len(resets[pid]), records[pid]
    # Each committed step ran at the learning rate of its size.
    assert all(abs(s["lr"] - 0.05 * s["size"]) < 1e-7 for step in steps.values() for s in step.values())

    with np.load(tmp_path / f"{survivor}.npz") as f:
        got = [f[f"arr_{i}"] for i in range(len(f.files))]
    for g, want in zip(got, _reference(steps)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_keras_fit_is_entered_again_from_the_commit_after_each_change(tmp_path):
    """Horovod's Keras example: fit(steps_per_epoch=12 // size, epochs=3 - state.epoch) with its three callbacks."""
    epochs = 3
    rc, out, err = run_job(2, "horovod_elastic_keras.py", "--epochs", epochs, "--crash-at", 5, "--crash-rank", 1,
                           "--resize-at", "10:2,16:3", "--record-dir", tmp_path, timeout=150,
                           extra_launcher_args=LAUNCH)  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    records = _records(tmp_path)
    ends = {pid: lines[-1] for pid, lines in records.items() if lines[-1]["event"] == "end"}
    assert len(ends) == 3, (sorted(records), report)
    assert len({(e["epoch"], e["batch"], e["trained"], e["weights"]) for e in ends.values()}) == 1, ends
    end = next(iter(ends.values()))
    assert (end["epoch"], end["batch"], end["size"]) == (epochs, 0, 3), end

    survivor = next(pid for pid, e in ends.items() if not e["joiner"])
    lines = records[survivor]
    resets = [i for i, r in enumerate(lines) if r["event"] == "reset"]
    assert [lines[i]["size"] for i in resets] == [1, 2, 3], [r for r in lines if r["event"] == "reset"]
    keys = ("epoch", "batch", "trained", "weights")
    # Rollback: batch 5 was trained (trained 4 -> 5) after the commit at 4; the crash failed the next one,
    # and the change left the values and weights of that commit (before the reset's own step).
    crash = lines[resets[0]]
    before = lines[: resets[0]]
    last_commit = [r for r in before if r["event"] == "commit"][-1]
    assert [r["trained"] for r in before if r["event"] == "trained"][-1] == 5, before
    assert {k: crash[k] for k in keys} == {k: last_commit[k] for k in keys}, (crash, last_commit)
    assert (crash["epoch"], crash["batch"], crash["trained"]) == (0, 4, 4), crash
    for i in resets[1:]:  # the admissions follow a commit: nothing to roll back, values as committed
        commit = [r for r in lines[:i] if r["event"] == "commit"][-1]
        assert {k: lines[i][k] for k in keys} == {k: commit[k] for k in keys}, (lines[i], commit)
    # fit is entered again after every change (and after a resumed epoch ends), each time from the state's
    # epoch and batch; the first entry after the crash resumes epoch 0 at batch 4.
    enters = [r for r in lines if r["event"] == "enter"]
    assert len(enters) >= 4, enters
    first_after = next(r for r in lines[resets[0]:] if r["event"] == "enter")
    assert (first_after["epoch"], first_after["batch"], first_after["size"]) == (0, 4, 1), first_after
    for i in resets:
        assert next(r["event"] for r in lines[i + 1:] if r["event"] in ("enter", "reset")) == "enter", lines[i:]
    # The epoch resumed after the crash ends its fit, and run enters the function again at the next epoch
    # without a change: an entry at batch 0 right after that epoch's end commit.
    marks = [r for r in lines if r["event"] in ("enter", "reset", "commit")]
    resumed_ends = [b for a, b in itertools.pairwise(marks) if a["event"] == "commit" and a["batch"] == 0
                    and b["event"] == "enter" and (b["epoch"], b["batch"]) == (a["epoch"], 0)]  # fmt: skip
    assert resumed_ends and resumed_ends[0]["epoch"] == 1, marks
    # Each epoch counted once: a commit at each epoch's end (batch 0 of the next), in order, none beyond.
    epoch_ends = sorted({r["epoch"] for r in lines if r["event"] == "commit" and r["batch"] == 0})
    assert epoch_ends == list(range(1, epochs + 1)), epoch_ends
    # Joiners: reset callbacks with the new size once admitted, entered after each.
    joiner_resets = sorted(([r["size"] for r in records[pid] if r["event"] == "reset"] for pid, e in ends.items()
                            if e["joiner"]), key=len, reverse=True)  # fmt: skip
    assert joiner_resets == [[2, 3], [3]], joiner_resets
    assert all(abs(r["lr"] - 0.02 * r["size"]) < 1e-9 for rs in records.values() for r in rs if r["event"] == "reset")
