"""benchmarks/harness/hosts.py: the two-host launch commands satisfy kungfu-run's multi-host checks.

A multi-host job needs the same KUNGFU_JOB_SECRET and KUNGFU_JOB_ID on every
host (kungfu_tf/run/worker_env/job_secret.py, job_id.py); without the id both launchers
exited at once and the two-host benchmarks measured nothing. Pure Python: no
namespaces, no processes.
"""

from __future__ import annotations

import pytest

from benchmarks.harness.hosts import TwoHosts, two_host_commands, two_host_env
from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.worker_env.job_id import resolve_job_id
from kungfu_tf.run.worker_env.job_secret import resolve_job_secret

HOSTS = TwoHosts(namespaces=("nsa", "nsb"), addresses=("10.9.0.1", "10.9.0.2"))


def launcher_options(argv: list[str]):
    """kungfu-run's parsed options of one command (after ``-m kungfu_tf.run``)."""
    return parse_args(argv[argv.index("kungfu_tf.run") + 1 :])


def test_each_host_runs_its_half_with_the_same_job_identity():
    argvs = two_host_commands(HOSTS, 4, ["python", "worker.py", "--x", "1"], ["--topology", "RING"])
    assert [a[:4] for a in argvs] == [["ip", "netns", "exec", "nsa"], ["ip", "netns", "exec", "nsb"]]
    options = [launcher_options(a) for a in argvs]
    for opt in options:
        assert opt.np == 4 and opt.topology == "RING"
        assert [(h.host, h.slots) for h in opt.hosts] == [("10.9.0.1", 2), ("10.9.0.2", 2)]
        assert list(opt.command) == ["python", "worker.py", "--x", "1"]
    assert [opt.self_host for opt in options] == [None, "10.9.0.2"]
    env = two_host_env()  # both launchers get this one
    assert resolve_job_secret(env, multi_host=True) == env["KUNGFU_JOB_SECRET"]
    assert resolve_job_id(env, multi_host=True) == env["KUNGFU_JOB_ID"]
    assert two_host_env()["KUNGFU_JOB_ID"] != env["KUNGFU_JOB_ID"]  # a new id for every run


def test_odd_worker_counts_are_refused():
    with pytest.raises(ValueError, match="np must be even and at least 2.*got 3"):
        two_host_commands(HOSTS, 3, ["python", "worker.py"])
