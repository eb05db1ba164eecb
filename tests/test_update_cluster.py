"""Elastic membership ops with real workers: shrink 3 -> 2, grow 2 -> 3 with
a joiner that started as a one-worker cluster, and interrupt. The worker
(tests/workers/update_cluster.py) checks every step against numpy.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

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
    import socket

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
        import json

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
    # start (6) + 3 switches x 7 + the interrupt (rank 0: 3 more).
    counts = assert_job_ok(rc, out, err, 3)
    assert counts == {0: 6 + 21 + 3, 1: 6 + 21, 2: 6}, info
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
