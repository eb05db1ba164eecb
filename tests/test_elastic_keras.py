"""Keras ``model.fit`` in an elastic job end to end (``kungfu-run --elastic``, models/elastic_train.py --api keras).

One run of 3 workers: the worker of rank 1 is killed (SIGKILL) as step 4 begins; the survivors' fit fails
on the lost peer, ``kungfu_tf.elastic.run`` recovers and ``elastic_fit`` re-enters fit on 2 workers
with the rest of the epoch. The launcher starts a replacement; at step 10 the workers wait for it
(``resize(3, wait=True)``), it joins with the state fetched from the survivors, the ElasticCallback stops fit
and fit is re-entered on 3 workers. Checked: every sample of each epoch trained exactly once, steps
numbered without gaps, the final epoch and step on every worker, identical final weights on the three
final workers, and equal to a one-process reference of the same steps.

The optimizer is ``SynchronousSGDOptimizer(keras.optimizers.Adam(...))``, not built before ``fit``: its slots
appear in the first step, as users write it, and the state is ``ElasticState(model=, optimizer=)``, as the
README writes it. Before the state built the optimizer itself, the job's signature lacked the slots that
the replacement's warm-up had built, and every replacement was rejected (the run failed: no worker was
admitted at step 10). The reference carries Adam's slots through the same steps.
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

SAMPLES, BATCH, EPOCHS, HIDDEN, LR, OPTIMIZER = 96, 4, 2, 16, 0.01, "adam"


def test_fit_survives_a_crash_and_takes_in_a_joiner(tmp_path):
    args = ["--api", "keras", "--samples", SAMPLES, "--batch-size", BATCH, "--epochs", EPOCHS, "--hidden", HIDDEN,
            "--lr", LR, "--optimizer", OPTIMIZER, "--crash-at", 4, "--crash-rank", 1, "--resize-at", "10:3", "--resize-wait",
            "--record-dir", tmp_path]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=150,
                           extra_launcher_args=["--elastic", "--max-np", "3"])  # fmt: skip
    assert rc == 0, describe(rc, out, err)
    assert "identical weights on all workers: True" in out, describe(rc, out, err)
    records = load(tmp_path)
    check_each_sample_once(records, SAMPLES, EPOCHS)
    steps = steps_by_index(records)
    assert [len(steps[s]) for s in (3, 4, 9, 10)] == [3, 2, 2, 3], {s: sorted(steps[s]) for s in (3, 4, 9, 10)}
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    assert len(ends) == 3, sorted(records)  # the crashed worker wrote no end
    assert {(e["step"], e["epoch"]) for e in ends.values()} == {(len(steps), EPOCHS)}
    assert len({e["weights_sha256"] for e in ends.values()}) == 1
    want = reference_weights(steps, SAMPLES, HIDDEN, LR, OPTIMIZER)
    for got, ref in zip(final_weights(tmp_path, next(iter(ends))), want):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)


def test_a_policy_callback_resizes_inside_elastic_fit_beside_a_crash(tmp_path):
    """A ``PolicyCallback`` inside ``elastic_fit`` (a policy that shrinks 3 -> 2 after step 14), in the same run as
    a crash (rank 1 at step 4) and its replacement (admitted at step 10): the policy's state goes to the
    joiner with the runner's (the sync compares it on every worker), the worker the policy's resize
    detaches stops ``fit`` and exits 0, and the two that remain hold the one-process reference weights."""
    args = ["--api", "keras", "--samples", SAMPLES, "--batch-size", BATCH, "--epochs", EPOCHS, "--hidden", HIDDEN,
            "--lr", LR, "--optimizer", OPTIMIZER, "--crash-at", 4, "--crash-rank", 1, "--resize-at", "10:3",
            "--resize-wait", "--policy-resize-at", "14:2", "--record-dir", tmp_path]  # fmt: skip
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
    ends = [lines[-1] for lines in records.values() if lines and lines[-1]["event"] == "end"]
    left = [e for e in ends if e["detached"]]
    assert len(left) == 1 and left[0]["step"] == 14, ends
    members = [e for e in ends if not e["detached"]]
    assert len(members) == 2 and len({e["weights_sha256"] for e in members}) == 1, ends
    stem = next(stem for stem, lines in records.items() if lines and lines[-1] in members)
    for got, ref in zip(final_weights(tmp_path, stem), reference_weights(steps, SAMPLES, HIDDEN, LR, OPTIMIZER)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
