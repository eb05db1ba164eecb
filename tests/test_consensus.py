"""consensus agrees on the whole tensor: dtype, shape and bytes (tests/workers/consensus_identity.py, np=2).

Tensors with identical data bytes but another dtype (float32 zeros and
int32 zeros) or another shape ([2, 3] and [3, 2]) must not agree; identical
tensors must.
"""

from __future__ import annotations

from conftest import assert_job_ok, run_job


def test_consensus_compares_dtype_shape_and_bytes():
    rc, out, err = run_job(2, "consensus_identity.py", timeout=180, extra_launcher_args=["--timeout", "30"])
    assert_job_ok(rc, out, err, 2, expected_checks=14)
