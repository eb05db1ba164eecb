"""Hundreds of differently named collectives in flight at once
(tests/workers/concurrency.py).

(a) A tf.function with 320 all-reduces (sizes 1 .. 300k elements, float32 /
    int32 / float64, sum and max) created in a different random order on each
    worker, matched across workers by name=; three steps with new data.
(b) 320 named all-reduces issued eagerly from 8 Python threads per worker;
    the assignment of chains to threads, start times and pauses differ per
    rank, and the worker asserts that several were in flight at once.

Every result is compared with numpy on every worker.
"""

from __future__ import annotations

import re

import pytest
from conftest import assert_job_ok, describe, rank_lines, run_job

N_OPS = 320
STEPS = 3


@pytest.mark.parametrize("np_", [2, 4])
def test_many_named_collectives_in_flight(np_):
    rc, out, err = run_job(np_, "concurrency.py", np_, timeout=150)
    assert_job_ok(rc, out, err, np_, STEPS * N_OPS + N_OPS + 1)
    for r, lines in rank_lines(out).items():
        steps = [line for line in lines if re.match(rf"tf.function step \d: {N_OPS} all-reduces", line)]
        assert len(steps) == STEPS, f"rank {r}\n" + describe(rc, out, err)
        eager = [line for line in lines if line.startswith(f"eager: {N_OPS} all-reduces from 8 threads")]
        assert len(eager) == 1, f"rank {r}\n" + describe(rc, out, err)
