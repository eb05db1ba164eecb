"""Pinning workers to cores (``kungfu-run --bind-to core``, ``KUNGFU_BIND_TO``), with real workers.

The worker (tests/workers/cpu_binding.py) checks that every one of its
threads, TensorFlow's from before the op library loaded included, has one
and the same single-core mask after an all-reduce, and that the workers'
cores differ. Unpinned, a small all-reduce in a tf.function ran at two
speeds depending on where the scheduler put the workers' threads
(kungfu_tf/run/worker_env/cpu_binding.py); pinned, at one.
"""

from __future__ import annotations

import os

import pytest
from conftest import assert_job_ok, run_job, worker_env

from kungfu_tf.run.worker_env.cpu_binding import (
    apply_cpu_binding,
    binding_mode,
    core_for,
    local_index,
)
from kungfu_tf.run.worker_env.worker_env import WorkerEnvError

CORES = str(len(os.sched_getaffinity(0)))


@pytest.mark.parametrize("how", ["flag", "env"])
def test_every_thread_of_every_worker_is_pinned_to_its_own_core(how):
    env = worker_env()
    env["CPU_BINDING_TEST_CORES"] = CORES
    launcher_args: list[str] = []
    if how == "flag":
        launcher_args = ["--bind-to", "core"]
    else:
        env["KUNGFU_BIND_TO"] = "core"
    rc, out, err = run_job(2, "cpu_binding.py", timeout=180, env=env, extra_launcher_args=launcher_args)
    assert_job_ok(rc, out, err, 2, expected_checks=4)


def test_without_binding_a_worker_may_run_on_every_core():
    # The same worker, unpinned: its check that all threads share one single-core mask must fail
    # wherever the job may use more than one core (what the pinned runs above are checked against).
    env = worker_env()
    env["CPU_BINDING_TEST_CORES"] = CORES
    env.pop("KUNGFU_BIND_TO", None)
    rc, out, err = run_job(2, "cpu_binding.py", timeout=180, env=env)
    if CORES == "1":  # a machine of one core: every mask is that core
        assert_job_ok(rc, out, err, 2)
        return
    assert rc != 0 and "the mask is one core" in out + err, out[-2000:] + err[-2000:]


def test_a_malformed_binding_stops_the_worker_naming_the_variable():
    env = worker_env()
    env["KUNGFU_BIND_TO"] = "socket"
    env["CPU_BINDING_TEST_CORES"] = CORES
    rc, out, err = run_job(2, "cpu_binding.py", timeout=180, env=env)
    assert rc != 0 and "KUNGFU_BIND_TO must be one of none, core, got 'socket'" in out + err, err[-2000:]


def test_core_choice_and_local_index():
    assert [core_for(i, {4, 1, 7}) for i in range(4)] == [1, 4, 7, 1]  # sorted, wrapping round
    peers = ["a:1", "b:1", "a:2", "a:3", "b:2"]
    assert [local_index(peers, p) for p in peers] == [0, 0, 1, 2, 1]
    assert binding_mode({}) == "none" and binding_mode({"KUNGFU_BIND_TO": "core"}) == "core"
    with pytest.raises(WorkerEnvError, match="KUNGFU_BIND_TO"):
        binding_mode({"KUNGFU_BIND_TO": "Core"})


def test_no_binding_for_a_joiner_or_a_process_outside_a_job():
    joiner = {"KUNGFU_BIND_TO": "core", "KUNGFU_JOINER": "1", "KUNGFU_PEERS": "a:1", "KUNGFU_SELF": "a:1"}
    assert apply_cpu_binding(joiner) is None  # it knows no peer but itself: no place among its host's workers
    assert apply_cpu_binding({"KUNGFU_BIND_TO": "core"}) is None
