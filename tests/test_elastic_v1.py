"""``tf.compat.v1`` MonitoredSession in an elastic job end to end (models/elastic_train.py --api v1).

One run of 3 workers with ``--min-np 1`` (crashed workers are not replaced): after 4 steps every worker
calls ``resize(2)`` through ``ElasticHook.eagerly``: rank 2 is detached and exits 0, the hook feeds the
others the new split. As step 9 begins, rank 1 is killed (SIGKILL): rank 0's ``session.run`` fails on the
lost peer, ``MonitoredSession`` asks for a new session, ``ElasticSessionCreator`` hands back the same one
(variables kept), the hook recovers the cluster, and the step runs again with the new feed. Checked: every
sample of each epoch trained exactly once, the final step and epoch, and the survivor's weights equal to a
one-process reference of the same steps (nothing re-initialized).
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
