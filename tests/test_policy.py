"""Adaptation policies with real workers (tests/workers/policy_runner.py), np=2.

One job runs every scenario (TF starts once): a custom tf.function loop
driven by PolicyRunner, Keras fit with PolicyCallback + GNSBatchSizePolicy
(a stand-in monitor duck-typed to the GradientMonitor contract), a v1
MonitoredTrainingSession with PolicyHook, AdaptiveTopologyPolicy on a
synthetic throughput, and bad use (disagreement, bad requests on one rank or
all, missing monitor / learning rate): batch-size changes shape the next
step without a re-trace, the learning rate follows its rule, topology
switches everywhere, the weights equal numpy SGD on the same schedule, and
every worker raises the precise error. Rank 0 reads its TensorBoard event
file back.
"""

from __future__ import annotations

from conftest import assert_job_ok, run_job

NP = 2
TENSORBOARD_CHECKS = 9  # rank 0 only


def test_policies_with_real_workers(tmp_path):
    rc, out, err = run_job(NP, "policy_runner.py", tmp_path / "tb", timeout=240)
    counts = assert_job_ok(rc, out, err, NP)
    assert counts[1] == 39 and counts[0] == counts[1] + TENSORBOARD_CHECKS, counts
