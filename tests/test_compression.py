"""Compressed all-reduce (kungfu_tf/strategy/kernels/compressor.py) near and beyond float16's range.

tests/workers/compressor_range.py at np=2: gradients of 40000 on both
workers (their sum, 80000, exceeds float16's 65504) train exactly as numpy
says with fp16/bf16 compression, with and without error feedback; a sum that
cannot be represented, or a NaN gradient on one worker, is an
InvalidArgumentError naming the variable on every worker, the residual stays
finite and the next step is right.
"""

from __future__ import annotations

from conftest import assert_job_ok, run_job


def test_fp16_compression_sums_without_overflow_and_rejects_non_finite():
    rc, out, err = run_job(2, "compressor_range.py", timeout=240, extra_launcher_args=["--timeout", "60"])
    assert_job_ok(rc, out, err, 2, expected_checks=18)
