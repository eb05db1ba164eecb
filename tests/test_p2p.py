"""Point-to-point primitives for the parameter-server strategies, on real jobs.

* push/take (tests/workers/push_take.py, np=3): ranks push tensors of every
  accumulator dtype to rank 0 (eagerly and in tf.functions); after a barrier
  rank 0 takes numpy's sum and the push count, then zeros and 0; a push of
  the wrong size is dropped and the receiver's next take raises
  InvalidArgumentError naming the sender and both sizes, keeping the good
  pushes.
* request_at_least (tests/workers/request_at_least.py, np=2, --timeout 3):
  rank 0 saves versions 1..5 with pauses; rank 1's requests for at least
  version 3 (eager) and 5 (tf.function) get such a version, holding its
  own version as value, after it was saved; a request for a version never
  saved fails after about 3 s with DeadlineExceededError naming rank 0, the
  blob and the version.
"""

from __future__ import annotations

import re

from conftest import assert_job_ok, describe, rank_lines, run_job

SPECS = 6  # dtypes pushed per phase


def test_push_take():
    np_ = 3
    rc, out, err = run_job(np_, "push_take.py", timeout=180, extra_launcher_args=["--timeout", "30"])
    per_phase = SPECS * 4  # (sum, count) of two takes per accumulator
    mismatch = 1 + 4 + 2  # declaring take, error needles, the take after
    counts = assert_job_ok(rc, out, err, np_)
    assert counts == {0: 2 * per_phase + mismatch, 1: 2 * per_phase, 2: 2 * per_phase}, describe(rc, out, err)
    assert any(line.startswith("mismatch: ") for line in rank_lines(out)[0]), describe(rc, out, err)


def test_request_at_least(tmp_path):
    timeout = 3
    rc, out, err = run_job(
        2, "request_at_least.py", tmp_path, timeout=120, extra_launcher_args=["--timeout", str(timeout)]
    )
    counts = assert_job_ok(rc, out, err, 2)
    assert counts == {0: 2, 1: 3 + 1 + 3 + 3}, describe(rc, out, err)
    lines = rank_lines(out)[1]
    found = [m for m in (re.match(r"^timeout after ([\d.]+)s: (.*)$", line) for line in lines) if m]
    assert len(found) == 1, describe(rc, out, err)
    assert timeout - 0.1 <= float(found[0].group(1)) <= timeout + 15, describe(rc, out, err)  # the deadline, not a hang


def test_rows():
    rc, out, err = run_job(3, "push_rows.py", timeout=120, extra_launcher_args=["--timeout", "30"])
    counts = assert_job_ok(rc, out, err, 3)
    assert counts == {0: 3 + 1 + 1 + 1, 1: 2 + 2 + 1 + 1, 2: 0}, describe(rc, out, err)
