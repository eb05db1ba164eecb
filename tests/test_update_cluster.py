"""Elastic membership ops with real workers: shrink 3 -> 2, grow 2 -> 3 with
a joiner that started as a one-worker cluster, and interrupt. The worker
(tests/workers/update_cluster.py) checks every step against numpy.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time

import pytest
from conftest import (
    REPO_ROOT,
    assert_job_ok,
    describe,
    finish_job,
    kill_tree,
    rank_lines,
    start_job,
    worker_env,
    worker_path,
)

SECRET = "5e" * 32
SWITCH_LINE = re.compile(r"^switch (\d+) ([\d.]+)$")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(path, proc: subprocess.Popen, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, "job ended early\n" + describe(proc.wait(), *proc.communicate())
        assert time.monotonic() < deadline, f"no {path.name} after {seconds} s"
        time.sleep(0.05)


def test_shrink_grow_interrupt(tmp_path):
    job = start_job(
        3,
        "update_cluster.py",
        tmp_path,
        extra_launcher_args=["--timeout", "60"],
        env=worker_env(KUNGFU_JOB_SECRET=SECRET),
    )
    joiner = None
    try:
        # The joiner can start only once the job id is known (rank 0 writes it).
        _wait_for(tmp_path / "job.json", job)
        info = json.loads((tmp_path / "job.json").read_text())
        me = f"127.0.0.1:{_free_port()}"
        joiner = subprocess.Popen(
            [sys.executable, worker_path("update_cluster.py"), str(tmp_path), "joiner"],
            cwd=REPO_ROOT,
            env=worker_env(
                KUNGFU_JOINER="1",
                KUNGFU_SELF=me,
                KUNGFU_PEERS=me,
                KUNGFU_CLUSTER_VERSION="0",
                KUNGFU_JOB_SECRET=SECRET,
                KUNGFU_JOB_ID=info["job_id"],
                KUNGFU_TIMEOUT="60",
            ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        rc, out, err = finish_job(job, timeout=180)
        joiner_out, joiner_err = joiner.communicate(timeout=60)
    except BaseException:
        kill_tree(job)
        if joiner is not None:
            kill_tree(joiner)
        raise
    info = describe(rc, out, err)
    joined = describe(joiner.returncode, joiner_out, joiner_err)
    # Rank 2 left after the first check (6 results); ranks 0 and 1 checked
    # start (6) + 3 switches x 7 + a refused older version + the interrupt
    # (rank 0: 3 more).
    counts = assert_job_ok(rc, out, err, 3)
    assert counts == {0: 6 + 21 + 1 + 3, 1: 6 + 21 + 1, 2: 6}, info
    assert joiner.returncode == 0, joined
    assert "checked 16 results" in joiner_out, joined  # 2 at the start + 2 switches x 7
    # Nobody took a peer switching versions for a stranger or a crash.
    for text in (err, joiner_err):
        assert "rejected a connection" not in text and "dropped" not in text, info + joined
    # The time of update_cluster + the first all-reduce, for the README.
    times = {
        (r, int(m.group(1))): float(m.group(2))
        for r, lines in rank_lines(out).items()
        for m in map(SWITCH_LINE.match, lines)
        if m
    }
    print("update_cluster + first all_reduce (ms):", times)


def test_bad_arguments_are_named():
    """In this process (a one-worker runtime, 127.0.0.1:0): every bad argument
    is refused with its name and value, and nothing changes."""
    import tensorflow as tf

    from kungfu_tf.ops import config, membership

    with pytest.raises(TypeError, match=r"peers must be a sequence of 'host:port' strings, got '127.0.0.1:10000'"):
        membership.update_cluster("127.0.0.1:10000", 1)
    with pytest.raises(ValueError, match=r"peers must list at least one"):
        membership.update_cluster([], 1)
    with pytest.raises(TypeError, match=r"peers\[1\] must be a 'host:port' string, got 5"):
        membership.update_cluster(["127.0.0.1:10000", 5], 1)
    with pytest.raises(ValueError, match=r"version must be an int in 1\.\.4294967295, got 0"):
        membership.update_cluster(["127.0.0.1:10000"], 0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"input 'peers' \[0\]: .*'no-port'"):
        membership.update_cluster(["no-port"], 3)
    me = membership.self_peer()
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=rf"update_cluster to version 3 \[127.0.0.1:10001\]: this worker \({re.escape(me)}, KUNGFU_SELF\) "
        r"is not in the new peer list",
    ):
        membership.update_cluster(["127.0.0.1:10001"], 3)
    with pytest.raises(ValueError, match=r"reason must be a non-empty string, got ''"):
        membership.interrupt("")
    assert membership.cluster_peers() == [me] and int(config.cluster_version()) == 0


def test_v1_graph_mode_reads_the_new_cluster():
    """kungfu_tf.rank()/size()/local_*() with eager execution disabled follow
    an update_cluster (they used to read the launcher's environment)."""
    me, other = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    proc = subprocess.run(
        [sys.executable, worker_path("update_cluster_v1.py"), other],
        check=False,
        cwd=REPO_ROOT,
        env=worker_env(
            KUNGFU_SELF=me, KUNGFU_PEERS=me, KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID="v1-graph-mode-test"
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    info = describe(proc.returncode, proc.stdout, proc.stderr)
    assert proc.returncode == 0, info
    assert "rank 1 size 2 local 1/2 version 1" in proc.stdout and "checked 2 results" in proc.stdout, info
