"""Elastic training end to end: real workers shrink (resize), grow (a joiner), and survive a SIGKILL.

The test plays the launcher's part: it serves the config service
(ConfigServer(elastic=True)) and starts the worker processes with the
environment ``kungfu-run --elastic`` gives them, plus one joiner started at
once (so that it is warm and READY when the job grows: Or et al.'s
pre-warmed joiner). One run of tests/workers/elastic_train.py covers:

* bad requests at step 2 (workers that disagree, a size above the
  maximum, an unknown worker): the same precise error on every worker,
  nothing changes;
* 3 -> 2 by ``resize(2)`` (in a ``tf.function``) at step 4: the worker of rank 2 is detached and
  exits 0, the others go on;
* 2 -> 3 by ``resize(3, wait=True)`` at step 8: the joiner is admitted and
  fetches the state (the sync ends with a digest consensus, so a joiner
  with other state fails the run), then trains in step with the others;
* a SIGKILL of the original rank 0 at step 14, before its step while its
  peers are inside theirs: the survivors report it, apply the next version,
  and finish with one worker fewer.

Every worker starts from different weights; the survivors' final weights
must equal a numpy run of the same 20 momentum-SGD steps from rank 0's
initial weights (each step's global batch is the same whatever the number
of workers), and their step and sample counters must be exact (the step
killed in flight is trained once, after the recovery).
"""

from __future__ import annotations

import re
import secrets
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import kill_tree, worker_env, worker_path

from kungfu_tf.run.config_server import ConfigServer, make_cluster
from kungfu_tf.run.peer_string import parse_peer_string
from kungfu_tf.run.ports import find_free_ports

STEPS, REFUSE_AT, SHRINK_AT, GROW_AT, KILL_AT = 20, 2, 4, 8, 14
DIM, BATCH, LR, MOMENTUM = 4, 6, 0.05, 0.9
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0])
JOB_TIMEOUT = 150


def seed_of(*parts: object) -> int:
    import zlib

    return zlib.crc32(repr(parts).encode())


def reference() -> np.ndarray:
    """The same updates in numpy, on one worker, from rank 0's initial weights."""
    w = np.random.default_rng(0).normal(size=DIM)
    b, vw, vb = 0.0, np.zeros(DIM), 0.0
    for step in range(STEPS):
        rng = np.random.default_rng(seed_of("elastic", step))
        x = rng.normal(size=(BATCH, DIM))
        y = x @ TRUE_W + 0.1 * rng.normal(size=BATCH)
        err = x @ w + b - y
        gw, gb = 2 * x.T @ err / BATCH, 2 * err.mean()
        vw, vb = MOMENTUM * vw - LR * gw, MOMENTUM * vb - LR * gb
        w, b = w + vw, b + vb
    return np.append(w, b)


def start(env: dict[str, str]) -> subprocess.Popen:
    args = [STEPS, REFUSE_AT, SHRINK_AT, GROW_AT, KILL_AT, env["VICTIM"]]
    return subprocess.Popen(
        [sys.executable, worker_path("elastic_train.py"), *map(str, args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_shrink_grow_and_crash_keep_every_worker_identical():
    ports = find_free_ports("127.0.0.1", 4)
    members = [f"127.0.0.1:{p}" for p in ports[:3]]
    joiner = f"127.0.0.1:{ports[3]}"
    secret, job_id = secrets.token_hex(32), "elastic-test"
    server = ConfigServer(
        secret=secret,
        job_id=job_id,
        cluster=make_cluster(1, [parse_peer_string(p) for p in members]),
        elastic=True,
        min_size=1,
        max_size=3,
    ).start()
    procs: dict[str, subprocess.Popen] = {}
    try:
        base = worker_env(
            KUNGFU_CONFIG_SERVER=server.address,
            KUNGFU_ELASTIC="1",
            KUNGFU_JOB_SECRET=secret,
            KUNGFU_JOB_ID=job_id,
            KUNGFU_TIMEOUT="30",
            VICTIM=members[0],
        )
        for rank, peer in enumerate(members):
            procs[peer] = start(
                {**base, "KUNGFU_SELF": peer, "KUNGFU_PEERS": ",".join(members), "KUNGFU_CLUSTER_VERSION": "1",
                 "KUNGFU_RANK": str(rank), "KUNGFU_SIZE": "3"}
            )
        procs[joiner] = start(
            {**base, "KUNGFU_SELF": joiner, "KUNGFU_PEERS": joiner, "KUNGFU_CLUSTER_VERSION": "0", "KUNGFU_JOINER": "1"}
        )
        outputs = {}
        deadline = time.monotonic() + JOB_TIMEOUT
        for peer, proc in procs.items():
            try:
                out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                for p in procs.values():
                    kill_tree(p, grace=1)
                dump = {k: p.communicate()[0][-4000:] for k, p in procs.items()}
                pytest.fail(f"the job did not finish within {JOB_TIMEOUT} s:\n" + "\n".join(f"--- {k}\n{v}" for k, v in dump.items()))
            outputs[peer] = (proc.returncode, out)
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p, grace=1)
        server.stop()
    report = "\n".join(f"--- {peer} exit {rc}\n{out[-6000:]}" for peer, (rc, out) in outputs.items())

    rc, out = outputs[members[0]]
    assert rc == -signal.SIGKILL and f"killing myself at step {KILL_AT}" in out, report
    rc, out = outputs[members[2]]
    assert rc == 0 and f"detached at step {SHRINK_AT}" in out, report
    assert "change v" not in out.split("resize(2)")[-1], report  # no later change reached it

    want = reference()
    finals = {}
    for peer in (members[1], joiner):
        rc, out = outputs[peer]
        assert rc == 0, report
        match = re.search(r"^final (\d+) (\d+) (.*)$", out, re.MULTILINE)
        assert match, report
        assert (int(match[1]), int(match[2])) == (STEPS, STEPS * BATCH), report
        finals[peer] = np.array([float(v) for v in match[3].split()])
        np.testing.assert_allclose(finals[peer], want, rtol=0, atol=1e-9, err_msg=report)
    np.testing.assert_array_equal(finals[members[1]], finals[joiner], err_msg=report)
    # The changes every survivor went through, at the steps they were planned.
    assert f"change v1->v2 size 2 step {SHRINK_AT}" in outputs[members[1]][1], report
    assert f"change v2->v3 size 3 step {GROW_AT} rank 1" in outputs[members[1]][1], report
    assert f"change v0->v3 size 3 step {GROW_AT} rank 2" in outputs[joiner][1], report  # from its own cluster
    # The original rank 0 died: the survivors are ranks 0 and 1 of version 4.
    assert f"change v3->v4 size 2 step {KILL_AT} rank 0" in outputs[members[1]][1], report
    assert f"change v3->v4 size 2 step {KILL_AT} rank 1" in outputs[joiner][1], report
    assert "warm " in outputs[joiner][1], report
    # Bad requests at step 2: refused alike on every member, precisely.
    for peer in members:
        out = outputs[peer][1]
        assert "refused disagreement: resize: the workers asked for different resizes" in out, report
        assert "refused out of range: resize: new_size=4 is outside the job's [min 1, max 3]" in out, report
        assert "refused unknown worker: resize: workers ['127.0.0.1:1'] are not members" in out, report


def test_resize_on_one_worker_every_form_and_every_refusal():
    port = find_free_ports("127.0.0.1", 1)[0]
    me = f"127.0.0.1:{port}"
    secret, job_id = secrets.token_hex(32), "elastic-alone"
    cluster = make_cluster(1, [parse_peer_string(me)])
    with ConfigServer(secret=secret, job_id=job_id, cluster=cluster, elastic=True, min_size=1, max_size=3) as server:
        env = worker_env(
            KUNGFU_CONFIG_SERVER=server.address,
            KUNGFU_ELASTIC="1",
            KUNGFU_JOB_SECRET=secret,
            KUNGFU_JOB_ID=job_id,
            KUNGFU_SELF=me,
            KUNGFU_PEERS=me,
            KUNGFU_CLUSTER_VERSION="1",
        )
        proc = subprocess.run(
            [sys.executable, worker_path("elastic_resize_alone.py")],
            check=False, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0 and "checked 16 results" in proc.stdout, proc.stdout + proc.stderr
