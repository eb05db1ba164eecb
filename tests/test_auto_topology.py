"""AUTO picks its topology by measuring (ops/runtime/auto_topology.h), np=3.

tests/workers/auto_topology.py all-reduces tensors of eleven sizes (five size
classes and their boundaries) concurrently in one tf.function, three
times: every worker must agree on each class's topology (a disagreement
fails the collective) and every result must equal numpy's bit for bit.
A malformed KUNGFU_AUTO_PROBES stops the worker with an error naming the
variable and the value; KUNGFU_AUTO_PROBES=0 (the fixed size rule) gives
the same exact results. The probe samples (ops.auto_probe_samples) grow and
then stop once every class has decided; with probing off they stay 0. Each
class's ops.auto_choice is then a topology, the same on every worker (empty
with probing off), and a negative size or a non-scalar is refused by name.
"""

from __future__ import annotations

import pytest
from conftest import assert_job_ok, describe, run_job, worker_env

NP = 3
SIZES, STEPS = 11, 3  # as in tests/workers/auto_topology.py
# the default topology, every result of every step, the probe samples, each class's auto_choice, two bad sizes
CHECKS = 1 + STEPS * SIZES + 2 + SIZES + 2


@pytest.mark.parametrize("probes", [None, "0"])
def test_auto_results_are_exact_and_agreed(probes):
    env = worker_env() if probes is None else worker_env(KUNGFU_AUTO_PROBES=probes)
    rc, out, err = run_job(NP, "auto_topology.py", timeout=240, env=env)
    assert_job_ok(rc, out, err, NP, CHECKS)


def test_bad_probe_count_is_named():
    rc, out, err = run_job(NP, "auto_topology.py", timeout=120, env=worker_env(KUNGFU_AUTO_PROBES="lots"))
    assert rc != 0, describe(rc, out, err)
    assert "KUNGFU_AUTO_PROBES='lots'" in out + err, describe(rc, out, err)
    assert "from 0 to 100" in out + err, describe(rc, out, err)
