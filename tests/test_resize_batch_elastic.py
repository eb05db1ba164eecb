"""A resize changes the batch by the job's rule, and the learning rate follows, with real workers.

``kungfu-run --elastic -np 2 --max-np 3 models/autoscale_train.py --policy schedule --resize-at 5:3``:
per-worker batch 64, ``PolicyRunner(lr_rule="linear", max_global_batch_size=160)`` (keep_local, Or et al.
§2.2). At 2 workers the global batch is 128; at 3 it would be 192 > 160, so each worker takes
160 // 3 = 53 (159 a step), and the learning rate follows the global batch: 0.1 * 159 / 128. Checked from
every worker's records, step by step: the per-worker batch and learning rate are the rule's for that
step's size, equal on every worker (the joiner's from its first step: it adopted the members' instead of
scaling its own), the samples advance by size * per-worker batch, and the weights stay identical.
Before, the global batch grew to 192 with the learning rate unchanged.
"""

from __future__ import annotations

import pytest
from autoscale_records import load, of, steps_by_index
from conftest import REPO_ROOT, describe, finish_job, start_job

SCRIPT = REPO_ROOT / "models" / "autoscale_train.py"
LOCAL, CAP, LR = 64, 160, 0.1


def test_the_batch_and_the_learning_rate_follow_a_growth(tmp_path):
    record = tmp_path / "record.jsonl"
    args = ["--policy", "schedule", "--resize-at", "5:3", "--after-settled", 10, "--batch-size", LOCAL,
            "--hidden", 32, "--lr", LR, "--lr-rule", "linear", "--max-global-batch", CAP, "--pace-step-ms", 50,
            "--record", record]  # fmt: skip
    proc = start_job(2, SCRIPT, *args, extra_launcher_args=["--elastic", "--min-np", "1", "--max-np", "3"])
    rc, out, err = finish_job(proc, timeout=300)
    assert rc == 0, describe(rc, out, err)
    records = load(record)
    steps = steps_by_index(records)
    seen_sizes, previous = set(), 0
    for step, rows in steps.items():
        size = rows[0]["size"]
        local = LOCAL if LOCAL * size <= CAP else CAP // size
        want_lr = LR * local * size / (LOCAL * 2)
        assert sorted(r["rank"] for r in rows) == list(range(size)), (step, rows)
        assert {r["local_batch"] for r in rows} == {local}, (step, rows)
        assert all(r["learning_rate"] == pytest.approx(want_lr, rel=1e-6) for r in rows), (step, want_lr, rows)
        assert len({r["learning_rate"] for r in rows}) == 1 and len({r["checksum"] for r in rows}) == 1, (step, rows)
        assert {r["samples"] for r in rows} == {previous + size * local}, (step, rows)
        previous += size * local
        seen_sizes.add(size)
    assert seen_sizes == {2, 3}
    ends = [e for e in of(records, "end") if not e["detached"]]
    assert len(ends) == 3 and len({e["weights_sha256"] for e in ends}) == 1, ends
