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

import os
import re
import secrets
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import describe, kill_tree, run_job, worker_env, worker_path

from kungfu_tf.run.control.config_server import ConfigClient, ConfigServer, make_cluster
from kungfu_tf.run.control.peer_string import parse_peer_string
from kungfu_tf.run.plan.ports import find_free_ports

STEPS, REFUSE_AT, SHRINK_AT, GROW_AT, KILL_AT = 20, 2, 4, 8, 14
DIM, BATCH, LR, MOMENTUM = 4, 6, 0.05, 0.9
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0])
JOB_TIMEOUT = 150


def seed_of(*parts: object) -> int:
    import zlib

    return zlib.crc32(repr(parts).encode())


def reference(steps: int = STEPS) -> np.ndarray:
    """The same updates in numpy, on one worker, from rank 0's initial weights."""
    w = np.random.default_rng(0).normal(size=DIM)
    b, vw, vb = 0.0, np.zeros(DIM), 0.0
    for step in range(steps):
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
            KUNGFU_TIMEOUT="120",
            VICTIM=members[0],
            ELASTIC_TEST_LOG=os.environ.get("ELASTIC_TEST_LOG", ""),
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
    # Detached by the shrink: it lowered its own CPU priority to the lowest (KUNGFU_DETACHED_NICE's default).
    assert rc == 0 and f"detached at step {SHRINK_AT} niceness 19" in out, report
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
    # (Versions as planned: v2 shrunk, v3 grown, v4 without the dead; one
    # more wherever a sync failed on a broken connection and was restarted.)
    def changed(peer: str, size: int, step: int, rank: int) -> bool:
        return re.search(rf"change v\d+->v\d+ size {size} step {step} rank {rank}", outputs[peer][1]) is not None

    assert changed(members[1], 2, SHRINK_AT, 1), report
    assert changed(members[1], 3, GROW_AT, 1) and changed(joiner, 3, GROW_AT, 2), report
    # The original rank 0 died: the survivors are ranks 0 and 1 now.
    assert changed(members[1], 2, KILL_AT, 0) and changed(joiner, 2, KILL_AT, 1), report
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


def test_with_the_launcher_a_crashed_worker_is_replaced_and_the_replacement_catches_up():
    """kungfu-run --elastic -np 2: rank 1 is SIGKILLed at step 4; the launcher reports it and starts a
    replacement joiner; rank 0 trains alone until the joiner is admitted (at the latest at step 10,
    where it waits for it with resize(2, wait=True)), and both finish with the reference weights."""
    steps = 16
    rc, out, err = run_job(
        2,
        "elastic_train.py",
        steps, -1, -1, 10, 4, "rank:1", "1:2",
        timeout=JOB_TIMEOUT,
        extra_launcher_args=["--elastic", "--timeout", "120"],
    )
    report = describe(rc, out, err)
    assert rc == 0, report
    assert "killing myself at step 4" in out, report
    finals = re.findall(r"final (\d+) (\d+) (.*)$", out, re.MULTILINE)
    assert len(finals) == 2, report
    want = reference(steps)
    for step, samples, values in finals:
        assert (int(step), int(samples)) == (steps, steps * BATCH), report
        np.testing.assert_allclose([float(v) for v in values.split()], want, rtol=0, atol=1e-9, err_msg=report)
    assert finals[0][2] == finals[1][2], report
    assert "joiner finished at step 16" in out, report


def _serve(members: list[str], job_id: str, max_size: int) -> tuple[ConfigServer, dict[str, str]]:
    secret = secrets.token_hex(32)
    server = ConfigServer(
        secret=secret, job_id=job_id, cluster=make_cluster(1, [parse_peer_string(p) for p in members]),
        elastic=True, min_size=1, max_size=max_size,
    ).start()
    base = worker_env(
        KUNGFU_CONFIG_SERVER=server.address, KUNGFU_ELASTIC="1", KUNGFU_JOB_SECRET=secret, KUNGFU_JOB_ID=job_id,
        KUNGFU_TIMEOUT="120", ELASTIC_TEST_LOG=os.environ.get("ELASTIC_TEST_LOG", ""),
    )
    return server, base


def _start_worker(base: dict[str, str], args: list[object], peer: str, members: list[str] | None) -> subprocess.Popen:
    env = {**base, "KUNGFU_SELF": peer}
    if members is None:
        env.update(KUNGFU_PEERS=peer, KUNGFU_CLUSTER_VERSION="0", KUNGFU_JOINER="1")
    else:
        env.update(KUNGFU_PEERS=",".join(members), KUNGFU_CLUSTER_VERSION="1",
                   KUNGFU_RANK=str(members.index(peer)), KUNGFU_SIZE=str(len(members)))
    return subprocess.Popen(
        [sys.executable, worker_path("elastic_train.py"), *map(str, args)], env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def _finish(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, tuple[int, str]]:
    outputs = {}
    deadline = time.monotonic() + timeout
    for peer, proc in procs.items():
        try:
            out, _ = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for p in procs.values():
                kill_tree(p, grace=1)
            dump = {k: p.communicate()[0][-4000:] for k, p in procs.items()}
            pytest.fail(f"the job did not finish within {timeout} s:\n" + "\n".join(f"--- {k}\n{v}" for k, v in dump.items()))
        outputs[peer] = (proc.returncode, out)
    return outputs


def test_resize_wait_with_joiners_admitted_in_separate_versions_and_a_member_finishing_first():
    """One worker calls resize(3, wait=True) at step 2; joiner A is admitted alone (v2), joiner B only
    later (v3: the test starts it after v2 was committed). A, synced at v2 while the member still waits,
    must wait with it (not start the step's collectives), so that all three apply v3 and train together.

    B is told to train one step less: it finishes (reporting itself finished before its goodbye) while
    the others are in the next step's check; they see the job ending at once (no timeout, no restart)."""
    steps, grow_at = 6, 2
    ports = find_free_ports("127.0.0.1", 3)
    member, joiner_a, joiner_b = (f"127.0.0.1:{p}" for p in ports)
    server, base = _serve([member], "elastic-two-joins", 3)
    # A runtime timeout longer than the whole test may take (JOB_TIMEOUT): a
    # worker that waited for a version that never comes cannot finish in
    # time, so finishing at all shows nobody did, however slow the host.
    base = {**base, "KUNGFU_TIMEOUT": "600"}
    args = [steps, -1, -1, grow_at, -1, "none", "1:3"]
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs[member] = _start_worker(base, args, member, [member])
        procs[joiner_a] = _start_worker(base, args, joiner_a, None)
        client = ConfigClient(server.address, secret=base["KUNGFU_JOB_SECRET"], job_id=base["KUNGFU_JOB_ID"])
        state = client.get_job_state()
        deadline = time.monotonic() + JOB_TIMEOUT
        while state.cluster.version < 2 and time.monotonic() < deadline and procs[member].poll() is None:
            state = client.wait_job_state(state.state_version, timeout=5.0)
        client.close()
        assert state.cluster.version == 2, f"joiner A was not admitted: {state}"
        procs[joiner_b] = _start_worker(base, [steps - 1, *args[1:]], joiner_b, None)
        last = procs.pop(joiner_b)
        out_b, _ = last.communicate(timeout=JOB_TIMEOUT)
        outputs = {joiner_b: (last.returncode, out_b)}
        outputs.update(_finish(procs, JOB_TIMEOUT))
        procs[joiner_b] = last
        client = ConfigClient(server.address, secret=base["KUNGFU_JOB_SECRET"], job_id=base["KUNGFU_JOB_ID"])
        finished = {f"{p.host}:{p.port}" for p in client.get_job_state().finished}
        client.close()
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p, grace=1)
        server.stop()
    report = "\n".join(f"--- {peer} exit {rc}\n{out[-6000:]}" for peer, (rc, out) in outputs.items())
    rc, out = outputs[joiner_b]
    match = re.search(r"^final (\d+) (\d+) (.*)$", out, re.MULTILINE)
    assert rc == 0 and match and (int(match[1]), int(match[2])) == (steps - 1, (steps - 1) * BATCH), report
    # B was synced at v3 and trained its steps in lockstep with the others.
    np.testing.assert_allclose([float(v) for v in match[3].split()], reference(steps - 1), rtol=0, atol=1e-9,
                               err_msg=report)
    # Both reached 3 workers at the resize's step (v3; or v4 where a broken connection restarted it).
    assert re.search(rf"change v\d+->v\d+ size 3 step {grow_at} rank 0", outputs[member][1]), report
    assert re.search(rf"change v\d+->v\d+ size 3 step {grow_at} rank 1", outputs[joiner_a][1]), report
    assert joiner_b in finished, report  # B reported itself (the test plays no launcher's part here)
    for peer in (member, joiner_a):
        rc, out = outputs[peer]
        assert rc == 0 and re.search(rf"the job is ending: [0-9.:, ]*{joiner_b}[0-9.:, ]* finished training", out), report
        assert f"detached at step {steps - 1}" in out, report


def test_a_failure_without_loss_after_a_joiner_only_version_restarts_it_and_nobody_waits():
    """The --admit-window 0 hang (joiners admitted one version each, back to back): joiner A, admitted in
    version 2, fails its first collective there although nobody was lost (a handshake with a live peer
    broken: injected here) while the member waits for it and version 3 (joiner B) is already committed.
    Applying 3, A would leave the member waiting until the timeout: A never connected to it in version 2,
    so no goodbye tells it A moved on, and its watcher ignores a joiner admission. A must restart the
    newest version (v4 = v3's members), which stops everyone; all three then train to the same weights
    as one process."""
    ports = find_free_ports("127.0.0.1", 3)
    member, *joiners = (f"127.0.0.1:{p}" for p in ports)
    server, base = _serve([member], "elastic-break-after-admission", 3)
    args = [STEPS, -1, -1, -1, -1, "none", "2:3", 1]
    procs: dict[str, subprocess.Popen] = {}
    try:
        client = ConfigClient(server.address, secret=base["KUNGFU_JOB_SECRET"], job_id=base["KUNGFU_JOB_ID"])
        client.request_size(2)  # the first joiner ready is admitted alone (v2); it asks for the other (v3)
        procs[member] = _start_worker(base, args, member, [member])
        for peer in joiners:
            procs[peer] = _start_worker(base, args, peer, None)
        outputs = _finish(procs, JOB_TIMEOUT)
        newest = client.get_job_state().cluster.version
        history = [[f"{p.host}:{p.port}" for p in client.get_cluster_at(v).workers] for v in range(1, newest + 1)]
        client.close()
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p, grace=1)
        server.stop()
    report = "\n".join(f"--- {peer} exit {rc}\n{out[-6000:]}" for peer, (rc, out) in outputs.items())
    assert len(history) == 4 and history[0] == [member] and history[3] == history[2], report
    first, second = history[1][1], history[2][2]
    assert sorted([first, second]) == sorted(joiners), report
    assert "breaking the first collective of v2 at v3" in outputs[first][1], report
    assert "restarting version 3 so that the members still in version 2 stop" in outputs[first][1], report
    want = reference()
    for peer, (rc, out) in outputs.items():
        match = re.search(r"^final (\d+) (\d+) (.*)$", out, re.MULTILINE)
        assert rc == 0 and match and (int(match[1]), int(match[2])) == (STEPS, STEPS * BATCH), report
        np.testing.assert_allclose([float(v) for v in match[3].split()], want, rtol=0, atol=1e-9, err_msg=report)
        assert re.search(r"change v\d+->v4 size 3", out), report
        # Nobody waited for a peer in another version until the timeout (KUNGFU_TIMEOUT=120 s).
        assert not [g for g in re.findall(r"gap before step \d+ ended: ([0-9.]+) s", out) if float(g) > 60], report


def test_a_joiner_left_without_any_holder_of_the_state_fails_clearly():
    """The only member syncs (the job has state) and dies; a joiner admitted with it (v2) finds itself alone
    once the member is reported lost (v3). It must fail naming the cause, not train from its warm-up weights."""
    ports = find_free_ports("127.0.0.1", 2)
    member, joiner = (f"127.0.0.1:{p}" for p in ports)
    server, base = _serve([member], "elastic-state-lost", 2)
    args = [6, -1, -1, -1, 0, "rank:0"]  # the member kills itself at step 0, right after its first sync
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs[member] = _start_worker(base, args, member, [member])
        procs[joiner] = _start_worker(base, args, joiner, None)
        procs[member].wait(timeout=JOB_TIMEOUT)
        client = ConfigClient(server.address, secret=base["KUNGFU_JOB_SECRET"], job_id=base["KUNGFU_JOB_ID"])
        state = client.request_size(2)  # the joiner is admitted with the dead member as soon as it is ready
        deadline = time.monotonic() + JOB_TIMEOUT
        while state.cluster.version < 2 and time.monotonic() < deadline and procs[joiner].poll() is None:
            state = client.wait_job_state(state.state_version, timeout=5.0)
        assert state.cluster.version == 2, f"the joiner was not admitted: {state}"
        client.report_lost(2, [member], "killed (the test plays the launcher)")
        client.close()
        outputs = _finish(procs, JOB_TIMEOUT)
    finally:
        for p in procs.values():
            if p.poll() is None:
                kill_tree(p, grace=1)
        server.stop()
    report = "\n".join(f"--- {peer} exit {rc}\n{out[-6000:]}" for peer, (rc, out) in outputs.items())
    assert outputs[member][0] == -signal.SIGKILL, report
    rc, out = outputs[joiner]
    assert rc == 1 and "final " not in out, report
    assert f"ElasticError: no member of cluster v3 holds the training state: its members ({joiner})" in out, report
