"""Sampled hybrid strategies (all-reduce + PS + partitioned variables, random merge groups and
topologies) train exactly like one process, on a real 2-worker job.

The worker (tests/workers/auto_sampled_equivalence.py) trains the first sampled
hybrid of each of three models and compares with one process trained on the union of
the batches (the builders' equivalence test's reference and tolerance).
"""

from __future__ import annotations

from conftest import assert_job_ok, rank_lines, run_job

PER_MODEL, MODELS = 1, 3


def test_sampled_hybrids_match_one_process():
    rc, out, err = run_job(2, "auto_sampled_equivalence.py", PER_MODEL, timeout=420, extra_launcher_args=["--timeout", "120"])
    cases = PER_MODEL * MODELS
    counts = assert_job_ok(rc, out, err, 2)
    # Agreement on both ranks (1 check each), the reference on rank 0 (2 checks: count, then values).
    assert counts == {0: 3 * cases, 1: cases}, counts
    lines = rank_lines(out)
    picked = [line for line in lines[0] if line.startswith("strategy auto-")]
    assert len(picked) == cases and picked == [line for line in lines[1] if line.startswith("strategy auto-")]
