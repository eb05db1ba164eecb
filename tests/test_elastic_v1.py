"""``tf.compat.v1`` MonitoredSession in an elastic job end to end (models/elastic_train.py --api v1).

One run of 3 workers with ``--min-np 1`` (crashed workers are not replaced): after 4 steps every worker
calls ``resize(2)`` through ``ElasticHook.eagerly``: rank 2 is detached and exits 0, the hook feeds the
others the new split. As step 9 begins, rank 1 is killed (SIGKILL): rank 0's ``session.run`` fails on the
lost peer, ``MonitoredSession`` asks for a new session, ``ElasticSessionCreator`` hands back the same one
(variables kept), the hook recovers the cluster, and the step runs again with the new feed. Checked: every
sample of each epoch trained exactly once, the final step and epoch, and the survivor's weights equal to a
one-process reference of the same steps (nothing re-initialized).

A second run puts a ``PolicyHook`` beside the ``ElasticHook``: a policy's resize, a crash and a replacement.
"""

from __future__ import annotations

import numpy as np
from conftest import describe, run_job
from elastic_records import (
    MODELS,
    check_each_sample_once,
    final_weights,
    load,
    reference_weights,
    steps_by_index,
)

SAMPLES, BATCH, EPOCHS, HIDDEN, LR = 96, 4, 2, 16, 0.1


def test_monitored_session_survives_a_resize_and_a_crash(tmp_path):
    args = ["--api", "v1", "--samples", SAMPLES, "--batch-size", BATCH, "--epochs", EPOCHS, "--hidden", HIDDEN,
            "--lr", LR, "--resize-at", "4:2", "--crash-at", 9, "--crash-rank", 1, "--record-dir", tmp_path]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=150, extra_launcher_args=["--min-np", "1"])
    assert rc == 0, describe(rc, out, err)
    assert "detached at step 4" in out, describe(rc, out, err)
    records = load(tmp_path)
    check_each_sample_once(records, SAMPLES, EPOCHS)
    steps = steps_by_index(records)
    assert [len(steps[s]) for s in (3, 4, 8, 9)] == [3, 2, 2, 1], {s: sorted(steps[s]) for s in (3, 4, 8, 9)}
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    finished = [stem for stem, end in ends.items() if not end["detached"]]
    assert len(ends) == 2 and len(finished) == 1, ends  # rank 2 detached; rank 1 crashed
    assert (ends[finished[0]]["step"], ends[finished[0]]["epoch"]) == (len(steps), EPOCHS)
    want = reference_weights(steps, SAMPLES, HIDDEN, LR)
    for got, ref in zip(final_weights(tmp_path, finished[0]), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_a_policy_hook_resizes_beside_an_elastic_hook_and_a_crash(tmp_path):
    """A ``PolicyHook`` beside the ``ElasticHook`` (its runner in ``ElasticState(policy=)``), 3 workers under
    ``kungfu-run --elastic --max-np 3``: rank 1 is killed (SIGKILL) as step 4 begins, the survivors recover in
    the same session, the launcher's replacement is admitted at step 10 (``resize(3, wait=True)``), and the
    policy (``ResizeAt``, ``ctx.resize(2)`` after step 14) shrinks the job: one worker detaches.

    Checked: the policy's state (its ``calls`` counter, counted from step 0) reaches the replacement, so
    every worker calling the policy at a step holds the same state; the detached worker makes no policy
    call after the one that detached it and exits 0; every worker ran one session and one graph
    (recoveries reused the session, nothing was added to the finalized graph); every sample of each
    epoch trained exactly once; the two remaining workers hold the one-process reference weights.

    Failed before ``PolicyRunner.join_running``: the replacement's PolicyHook ran ``before_train``'s rounds,
    which the members, in their next step, never joined (KUNGFU_TIMEOUT in the step's all-reduce)."""
    args = ["--api", "v1", "--samples", SAMPLES, "--batch-size", BATCH, "--epochs", EPOCHS, "--hidden", HIDDEN,
            "--lr", LR, "--crash-at", 4, "--crash-rank", 1, "--resize-at", "10:3", "--resize-wait",
            "--policy-resize-at", "14:2", "--record-dir", tmp_path]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=150,
                           extra_launcher_args=["--elastic", "--max-np", "3"])  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    assert "identical weights on all workers: True" in out, report
    assert "size 3 -> 2 [ResizeAt (--policy-resize-at 14:2)]" in out, report
    records = load(tmp_path)
    check_each_sample_once(records, SAMPLES, EPOCHS)
    steps = steps_by_index(records)
    assert [len(steps[s]) for s in (3, 4, 9, 10, 13, 14)] == [3, 2, 2, 3, 3, 2], report

    # The policy's state: one value per step on every worker that called it, counting every call of the job.
    calls: dict[int, set[int]] = {}
    for lines in records.values():
        for r in lines:
            if r["event"] == "policy":
                calls.setdefault(r["step"], set()).add(r["state"]["calls"])
    assert all(len(v) == 1 for v in calls.values()), calls
    counts = [next(iter(calls[s])) for s in sorted(calls)]
    assert counts == list(range(1, len(counts) + 1)), calls  # no worker started over
    first_step = {stem: next(r["step"] for r in lines if r["event"] == "step") for stem, lines in records.items()}
    replacement = [records[stem] for stem, step in first_step.items() if step > 0]
    assert sorted(first_step.values()) == [0, 0, 0, 10], first_step  # 3 workers, then the replacement
    first_call = next(r for r in replacement[0] if r["event"] == "policy")
    assert first_call["step"] >= 10 and first_call["state"]["calls"] > 1, first_call

    ends = [lines[-1] for lines in records.values() if lines and lines[-1]["event"] == "end"]
    assert len(ends) == 3, sorted(records)  # the crashed worker wrote no end
    left = [stem for stem, lines in records.items() if lines[-1]["event"] == "end" and lines[-1]["detached"]]
    assert len(left) == 1, ends
    policy_steps = [r["step"] for r in records[left[0]] if r["event"] == "policy"]
    assert policy_steps[-1] == 13 and records[left[0]][-1]["step"] == 14, records[left[0]][-3:]
    assert all(r["step"] <= 13 for r in records[left[0]] if r["event"] in ("policy", "step")), records[left[0]][-3:]

    for stem, lines in records.items():
        graph = [r for r in lines if r["event"] == "graph"]
        if lines[-1]["event"] != "end":
            continue  # the crashed worker
        assert len(graph) == 1 and graph[0]["sessions_created"] == 1, (stem, graph)
        assert graph[0]["ops_at_end"] == graph[0]["ops_at_start"], (stem, graph)
    survivors = [lines for stem, lines in records.items() if lines[-1]["event"] == "end" and first_step[stem] == 0]
    assert sorted(next(r for r in g if r["event"] == "graph")["sessions_asked"] for g in survivors) == [2, 2], survivors

    members = [e for e in ends if not e["detached"]]
    assert len(members) == 2 and len({e["weights_sha256"] for e in members}) == 1, ends
    assert {(e["step"], e["epoch"]) for e in members} == {(len(steps), EPOCHS)}, members
    stem = next(stem for stem, lines in records.items() if lines[-1] in members)
    for got, ref in zip(final_weights(tmp_path, stem), reference_weights(steps, SAMPLES, HIDDEN, LR)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
