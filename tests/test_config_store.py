"""``kungfu-run --config-store etcd://...``: the elastic job's state in a real etcd cluster.

Every test starts its own etcd members (tests/etcd_cluster.py: the Debian
``etcd`` binary on free loopback ports) and stops them. The launcher tests
run two launchers on loopback as two hosts (127.0.0.1 and 127.0.0.2, each
with ``--self``) and the config-service-only fake worker
(tests/workers/elastic_fake_worker.py), so what is tested is the control
plane: leases, duties, takeover, compare-and-set, authentication.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Self

import pytest
from conftest import REPO_ROOT, worker_env, worker_path
from netns import make_two_hosts
from waiting import HANG_BOUND_SECONDS, NEVER_SECONDS

from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.port_block import free_port_block
from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control import stored_job_state
from kungfu_tf.run.control.etcd_client import EtcdClient
from kungfu_tf.run.control.etcd_job_store import EtcdJobStore
from kungfu_tf.run.control.job_state import JobStateMachine
from kungfu_tf.run.control.peer_string import parse_peer_string as peer
from kungfu_tf.run.control.stored_job_state import (
    StoredJobStateMachine,
    StoreUnavailableJobError,
)
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.plan.config_store import parse_config_store
from kungfu_tf.run.plan.elastic_plan import build_elastic_plan

FAKE = worker_path("elastic_fake_worker.py")
SECRET = "0123456789abcdef" * 4
SIGNATURE = "w (2,) float32"
LOOPBACK_HOSTS = ("127.0.0.1", "127.0.0.2")  # the two emulated hosts of the launcher tests


@pytest.fixture
def etcd3(tmp_path):
    cluster = EtcdCluster(tmp_path, members=3)
    yield cluster
    cluster.close()


def initial_machine(n: int = 2, **kwargs) -> JobStateMachine:
    workers = [peer(f"h:{i + 1}") for i in range(n)]
    return JobStateMachine(config_pb2.Cluster(version=1, workers=workers), elastic=True, **kwargs)


def store_for(cluster: EtcdCluster, job_id: str, secret: str = SECRET, log=None) -> EtcdJobStore:
    return EtcdJobStore(EtcdClient(cluster.endpoints), job_id=job_id, secret=secret, log=log or (lambda _: None))


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    "value, message",
    [
        ("h1:2379", "or etcds://... for TLS (only etcd is supported), got no scheme"),
        ("consul://h1:8500", "(only etcd is supported), got consul://"),
        ("etcd://", "endpoint 1 is empty"),
        ("etcd://h1:2379,,h2:2379", "endpoint 2 is empty"),
        ("etcd://h1", "endpoint 1 'h1' is not HOST:PORT with a port in 1..65535"),
        ("etcd://h1:0", "endpoint 1 'h1:0' is not HOST:PORT"),
        ("etcd://h1:2379,h2:99999", "endpoint 2 'h2:99999' is not HOST:PORT"),
        ("etcd://h1:2379/kungfu", "no path may follow the endpoints"),
        ("etcd://h1:2379,h1:2379", "endpoint h1:2379 is named twice"),
    ],
)
def test_malformed_config_store_is_named(value, message):
    with pytest.raises(LaunchError, match=re.escape(f"bad --config-store {value!r}: ") + ".*" + re.escape(message)):
        parse_config_store(value)


def test_config_store_from_the_environment_and_conflicts(capsys):
    env = {"KUNGFU_JOB_SECRET": SECRET, "KUNGFU_JOB_ID": "j", "KUNGFU_CONFIG_STORE": "etcd://a:1,b:2"}
    plan = build_elastic_plan(parse_args(["-np", "2", "--elastic", "-H", "127.0.0.1:2", "true"]), env)
    assert plan.config_store == ("a:1", "b:2") and plan.serves and plan.config_host == "127.0.0.1"
    assert [p.address for p in plan.initial_peers] == ["127.0.0.1:10000", "127.0.0.1:10001"]
    with pytest.raises(LaunchError, match=re.escape("bad KUNGFU_CONFIG_STORE 'etcd:/a:1': expected etcd://")):
        build_elastic_plan(parse_args(["-np", "2", "--elastic", "true"]), {**env, "KUNGFU_CONFIG_STORE": "etcd:/a:1"})
    for args, message in (
        (["--elastic", "--config-server", "h:1"], "give either --config-server or --config-store, not both"),
        ([], "--config-store etcd://a:1 is only used by elastic jobs (--elastic or --min-np)"),
        (["--elastic", "--host-discovery-script", "x"], "--host-discovery-script is not supported with --config-store"),
    ):
        with pytest.raises(SystemExit) as exit_:
            parse_args(["-np", "2", "--config-store", "etcd://a:1", *args, "true"])
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err
    with pytest.raises(LaunchError, match="KUNGFU_JOB_SECRET"):
        build_elastic_plan(parse_args(["-np", "2", "--elastic", "--config-store", "etcd://a:1", "true"]), {})


# ------------------------------------------------------- the store itself


def test_two_launchers_share_one_job_through_etcd(etcd3, monkeypatch):
    """Two state machines over one etcd record: a change made through one is
    seen by the other's long poll (the watch), and the compare-and-set lets
    exactly one of two conflicting writers commit."""
    monkeypatch.setattr(stored_job_state, "MAX_WAIT_SECONDS", NEVER_SECONDS)
    job = f"share-{uuid.uuid4().hex[:8]}"
    a_store, b_store = store_for(etcd3, job), store_for(etcd3, job)
    a = StoredJobStateMachine(a_store, initial_machine(2, max_size=3))
    b = StoredJobStateMachine(b_store, initial_machine(1))  # the job exists: b's initial is not used
    try:
        assert [w.port for w in b.cluster().workers] == [1, 2]
        before = b.job_state().state_version
        woke = []
        # An hour's wait: only the watch can end it within the hang bound (a
        # 20 s wait that timed out returned the same state, so it proved nothing).
        waiter = threading.Thread(target=lambda: woke.append(b.wait(before, NEVER_SECONDS)), daemon=True)
        waiter.start()
        a.set_signature(SIGNATURE)
        waiter.join(HANG_BOUND_SECONDS)
        assert woke and woke[0].signature == SIGNATURE and woke[0].state_version > before

        b.request_size(3)
        state = a.joiner_ready(peer("h:3"), SIGNATURE)
        assert (state.cluster.version, [w.port for w in state.cluster.workers]) == (2, [1, 2, 3])
        assert b.commit_reason(2) == "admitted h:3"

        # Two reports about version 2 from two launchers: the first commits v3, the second changes nothing.
        results = []
        threads = [
            threading.Thread(target=lambda m=m, p=p: results.append(m.report_lost(2, [peer(p)], "x")))
            for m, p in ((a, "h:1"), (b, "h:2"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        final = a.job_state()
        assert final.cluster.version == 3 and len(final.cluster.workers) == 2, final
    finally:
        for m, s in ((a, a_store), (b, b_store)):
            m.close()
            s.close()


def test_records_without_the_job_secret_are_ignored_and_logged(etcd3):
    """A process without the job secret writes a newer state record (a
    cluster of its choosing) and a launcher key: readers ignore both, name
    them in a log line, and the job's next change commits above the forgery."""
    job = f"forge-{uuid.uuid4().hex[:8]}"
    lines: list[str] = []
    store = store_for(etcd3, job, log=lines.append)
    jobs = StoredJobStateMachine(store, initial_machine(2))
    try:
        forger = store_for(etcd3, job, secret="f" * 64)
        record, version = forger.load()
        assert record is None  # the forger cannot read the job's record either
        evil = initial_machine(1).to_record()
        evil["state_version"] = 10**6
        assert forger.compare_and_set(version, evil)
        etcd = EtcdClient(etcd3.endpoints)
        etcd.put(f"/kungfu/{job}/launchers/10.6.6.6".encode(), b'{"payload": "{\\"host\\": \\"10.6.6.6\\"}", "tag": "00"}')

        state = jobs.job_state()
        assert [w.port for w in state.cluster.workers] == [1, 2]  # not the forger's cluster
        assert store.live_launchers() == set()
        forged_state = [line for line in lines if f"/kungfu/{job}/state/" in line]
        assert forged_state and "its tag does not match the job secret" in forged_state[0], lines
        assert any(f"/kungfu/{job}/launchers/10.6.6.6" in line and "does not match" in line for line in lines), lines
        jobs.set_signature(SIGNATURE)
        assert jobs.job_state().signature == SIGNATURE
        fresh = StoredJobStateMachine(store_for(etcd3, job), initial_machine(3))
        assert fresh.job_state().signature == SIGNATURE and len(fresh.cluster().workers) == 2
        fresh.close()
        etcd.close()
        forger.close()
    finally:
        jobs.close()
        store.close()


def test_a_launcher_with_another_secret_is_refused(etcd3):
    """A job's record exists in etcd; a launcher with the same job id but
    another secret cannot open it: it names the ignored record and stops
    (exit 2) instead of starting a second job beside it."""
    job = f"secret-{uuid.uuid4().hex[:8]}"
    store = store_for(etcd3, job)
    jobs = StoredJobStateMachine(store, initial_machine(2))
    try:
        other = worker_env(KUNGFU_JOB_SECRET="f" * 64, KUNGFU_JOB_ID=job)
        run = subprocess.run(
            [sys.executable, "-m", "kungfu_tf.run", "-np", "1", "--elastic", "--config-store", etcd3.url,
             sys.executable, FAKE, "grow", "1"],
            cwd=REPO_ROOT, env=other, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
        )
    finally:
        jobs.close()
        store.close()
    assert run.returncode == 2, run.stderr
    assert re.search(rf"ignoring etcd record /kungfu/{job}/state/0+1 \(revision \d+\): its tag does not match", run.stderr)
    assert f"error: the job {job} in {etcd3.url} has 1 state record(s), none sealed with this KUNGFU_JOB_SECRET" in run.stderr
    assert "started" not in run.stdout + run.stderr and "member" not in run.stdout, run.stdout


def test_leader_kill_during_resizes_never_splits_the_cluster(etcd3):
    """Two launchers keep committing resizes (PutCluster, a compare-and-set on
    the version) while the etcd leader is SIGKILLed: every attempt either
    commits or fails with a precise UNAVAILABLE-class error and is retried;
    the committed versions form one chain (no version committed twice with
    different members), as seen by a third reader that replays the history."""
    job = f"leader-{uuid.uuid4().hex[:8]}"
    stores = [store_for(etcd3, job) for _ in range(2)]
    machines = [StoredJobStateMachine(s, initial_machine(2, max_size=8)) for s in stores]
    errors: list[str] = []
    commits: dict[int, list[list[str]]] = {}
    stop = threading.Event()

    def resizer(m: StoredJobStateMachine, tag: int) -> None:
        n = 0
        while not stop.is_set():
            current = m.cluster()
            workers = [f"{tag}.{n}.{i}" for i in range(2 + n % 3)]
            n += 1
            cluster = config_pb2.Cluster(version=current.version + 1, workers=[peer(f"h{w}:1") for w in workers])
            try:
                done = m.put_cluster(cluster)
            except StoreUnavailableJobError as e:
                errors.append(str(e))
                continue
            except Exception as e:  # noqa: BLE001 (a version conflict: re-read and retry)
                if "version conflict" not in str(e):
                    errors.append(f"unexpected: {e!r}")
                continue
            commits.setdefault(done.version, []).append([w.host for w in done.workers])

    threads = [threading.Thread(target=resizer, args=(m, i)) for i, m in enumerate(machines)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(commits) < 5:
            assert time.monotonic() < deadline, "no resize committed before the leader kill"
            time.sleep(0.05)
        killed = etcd3.leader()
        before = max(commits)
        etcd3.stop(killed)
        while max(commits) < before + 10:
            assert time.monotonic() < deadline + 30, f"resizes stopped after the leader kill: {errors[-3:]}"
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not [e for e in errors if e.startswith("unexpected")], errors
    for e in errors:
        assert "cannot commit now, so membership changes wait" in e, e
    # Every version was committed once, by one writer, with the members it reported.
    assert all(len(v) == 1 for v in commits.values()), {k: v for k, v in commits.items() if len(v) > 1}
    reader = StoredJobStateMachine(store_for(etcd3, job), initial_machine(1))
    last = reader.cluster().version
    for v in range(max(2, last - 3), last + 1):  # the record keeps the whole history
        if v in commits:
            assert [w.host for w in reader.cluster_at(v).workers] == commits[v][0]
    reader.close()
    for m, s in zip(machines, stores):
        m.close()
        s.close()


def test_majority_lost_changes_wait_and_say_why_then_resume(etcd3):
    """Two of three members stopped: reads answer the last state (training
    goes on), a change fails with UNAVAILABLE naming the store and that
    changes wait; once a member is back, the same change commits."""
    job = f"quorum-{uuid.uuid4().hex[:8]}"
    store = store_for(etcd3, job)
    jobs = StoredJobStateMachine(store, initial_machine(2, max_size=3))
    try:
        jobs.set_signature(SIGNATURE)
        leader = etcd3.leader()
        stopped = [i for i in range(3) if i != leader][:1] + [leader]
        for i in stopped:
            etcd3.stop(i)
        state = jobs.job_state()
        assert state.signature == SIGNATURE and len(state.cluster.workers) == 2
        with pytest.raises(StoreUnavailableJobError) as refused:
            jobs.request_size(3)
        assert refused.value.code == "UNAVAILABLE"
        assert f"the config store etcd://{','.join(etcd3.endpoints)} cannot commit now" in str(refused.value)
        assert "membership changes wait (training goes on at its size)" in str(refused.value)
        etcd3.start(stopped[0])
        deadline = time.monotonic() + 30
        while True:
            try:
                state = jobs.request_size(3)
                break
            except StoreUnavailableJobError:
                assert time.monotonic() < deadline, "changes did not resume after quorum came back"
                time.sleep(0.2)
        assert state.target_size == 3
    finally:
        jobs.close()
        store.close()


# ------------------------------------------------- launchers: the takeover


def _reader(stream, into: list[str]) -> threading.Thread:
    t = threading.Thread(target=lambda: [into.append(line) for line in stream], daemon=True)
    t.start()
    return t


def _wait_for(
    lines: list[str], pattern: str, timeout: float, what: str, proc: subprocess.Popen, job: _Launchers | None = None
) -> None:
    """Until a line of ``lines`` matches; a failure shows every launcher of ``job`` (why one waits is often another's)."""
    deadline = time.monotonic() + timeout
    while not any(re.search(pattern, line) for line in list(lines)):
        shown = job.info() if job is not None else "".join(lines)
        assert proc.poll() is None or any(re.search(pattern, line) for line in list(lines)), (
            f"{what}: launcher exited {proc.returncode} first:\n{shown}"
        )
        assert time.monotonic() < deadline, f"{what}: no line matching {pattern!r} in {timeout} s:\n{shown}"
        time.sleep(0.05)


class _Launchers:
    """Launchers of one job, one per emulated host, their output read into lists as it comes;
    every launcher still running at the end is killed with its process group."""

    def __init__(self, common: list[str], env: dict[str, str]) -> None:
        self.common, self.env = common, env
        self.procs: dict[str, subprocess.Popen] = {}
        self.out: dict[str, list[str]] = {}
        self.err: dict[str, list[str]] = {}

    def start(self, name: str, host: str, *worker: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "kungfu_tf.run", *self.common, "--self", host, *worker],
            cwd=REPO_ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )
        self.procs[name], self.out[name], self.err[name] = proc, [], []
        _reader(proc.stdout, self.out[name])
        _reader(proc.stderr, self.err[name])
        return proc

    def info(self) -> str:
        return "\n".join(f"--- {n} ---\n{''.join(self.err[n])}{''.join(self.out[n])}" for n in self.procs)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _children(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        text = open(f"/proc/{pid}/task/{pid}/children").read()  # noqa: SIM115
        return [int(p) for p in text.split()]
    return []


def test_launcher_killed_with_its_worker_another_takes_over(etcd3):
    """Host A (127.0.0.1) runs rank 0 and holds the placer duty; host B
    (127.0.0.2) runs ranks 1 and 2. SIGKILL A's launcher and its worker:
    A's lease expires, B takes the duty over, reports A's member lost,
    places the replacement on its own host (A's is dead) and starts it;
    the job ends whole at version 3 and B exits 0."""
    job = f"takeover-{uuid.uuid4().hex[:8]}"
    base = free_port_block(41, hosts=LOOPBACK_HOSTS)
    common = [
        "-np", "3", "--elastic", "-H", "127.0.0.1:1,127.0.0.2:3", "--config-store", etcd3.url,
        "--admit-window", "0", "--port-range", f"{base}-{base + 40}", "--timeout", "30",
    ]
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job)
    with _Launchers(common, env) as launchers:
        procs, out, err = launchers.procs, launchers.out, launchers.err
        for name, host in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
            launchers.start(name, host, sys.executable, FAKE, "hold-replaced")
            if name == "a":
                _wait_for(err["a"], r"places joiners and answers for lost launchers", 60, "A holds the duty", procs["a"], launchers)
        _wait_for(out["a"], r"signature set", 60, "rank 0 started on A", procs["a"], launchers)
        _wait_for(err["b"], r"live launchers: 127\.0\.0\.1, 127\.0\.0\.2", 60, "B sees both launchers", procs["b"], launchers)
        workers = _children(procs["a"].pid)
        assert len(workers) == 1, f"A should run one worker, runs {workers}"
        os.kill(procs["a"].pid, signal.SIGKILL)
        os.kill(workers[0], signal.SIGKILL)
        procs["a"].wait(10)
        assert procs["b"].wait(90) == 0, "".join(err["b"])
    lost = f"127.0.0.1:{base}"
    b_err, b_out = "".join(err["b"]), "".join(out["b"])
    reason = "the launcher of 127.0.0.1 is gone (its etcd lease expired)"
    assert f"{reason}: reporting {lost} lost" in b_err
    assert f"cluster v2: 3 -> 2 workers (lost {lost}: {reason})" in b_err
    assert "127.0.0.2 places joiners and answers for lost launchers" in b_err  # the takeover
    started = re.search(r"started joiner \[3\] (127\.0\.0\.2:\d+)", b_err)
    assert started, b_err
    assert f"cluster v3: 2 -> 3 workers (admitted {started.group(1)})" in b_err
    assert sorted(re.findall(r"^\[(\d)\] saw 3 workers at v3$", b_out, re.MULTILINE)) == ["1", "2"], b_out
    assert "[3] admitted at v3 as rank 2 of 3" in b_out.splitlines(), b_out
    # B took over only after A was gone: before, A held the duty.
    assert b_err.index("live launchers: 127.0.0.2\n") < b_err.index("127.0.0.2 places joiners")
    # The job's record stays in etcd: the same job id again is refused, naming why.
    again = subprocess.run(
        [sys.executable, "-m", "kungfu_tf.run", *common, "--self", "127.0.0.2", sys.executable, FAKE, "hold-replaced"],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
    )
    assert again.returncode == 2, again.stderr
    assert f"error: job {job} already ran to its end in {etcd3.url} (every member finished)" in again.stderr


def test_a_dead_launchers_members_and_joiners_are_let_go(etcd3):
    """Host B (127.0.0.2, rank 0, the placer duty) and host A (127.0.0.1,
    ranks 1 and 2, and a joiner B placed there that never gets ready). A's
    launcher is SIGKILLed (its processes die with it, nobody reports them):
    when its lease expires, B reports A's members lost and withdraws A's
    joiner, and places no joiner on A again; rank 0 sees the joiner go and
    the job ends with it. The job's record in etcd lists the joiner as
    withdrawn."""
    job = f"claims-{uuid.uuid4().hex[:8]}"
    base = free_port_block(41, hosts=LOOPBACK_HOSTS)
    common = [
        "-np", "3", "--max-np", "4", "--elastic", "-H", "127.0.0.2:1,127.0.0.1:3", "--config-store", etcd3.url,
        "--admit-window", "0", "--port-range", f"{base}-{base + 40}", "--timeout", "30",
    ]
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job)
    with _Launchers(common, env) as launchers:
        procs, out, err = launchers.procs, launchers.out, launchers.err
        for name, host in (("b", "127.0.0.2"), ("a", "127.0.0.1")):
            launchers.start(name, host, sys.executable, FAKE, "stuck", "1")
            if name == "b":
                _wait_for(err["b"], r"places joiners and answers for lost launchers", 60, "B holds the duty", procs["b"], launchers)
        _wait_for(err["a"], rf"started joiner \[3\] 127\.0\.0\.1:{base + 2}", 60, "A starts the joiner", procs["a"], launchers)
        os.kill(procs["a"].pid, signal.SIGKILL)
        rc_b = procs["b"].wait(60)
    info = launchers.info()
    assert rc_b == 0, info
    b_err = "".join(err["b"])
    reason = "the launcher of 127.0.0.1 is gone (its etcd lease expired)"
    assert f"{reason}: reporting 127.0.0.1:{base}, 127.0.0.1:{base + 1} lost" in b_err, info
    assert f"cluster v2: 3 -> 1 workers (lost 127.0.0.1:{base}, 127.0.0.1:{base + 1}: {reason})" in b_err, info
    assert "[0] saw 1 joiners come and go; 0 joiners now\n" in out["b"], info
    assert not re.search(r"placed joiner 127\.0\.0\.1", b_err.split(reason)[-1]), info
    store = store_for(etcd3, job)
    record, _ = store.load()
    store.close()
    assert record is not None and record["joiners"] == [] and record["removed"] == [f"127.0.0.1:{base + 2}"], record


def test_leader_killed_while_a_joiner_is_admitted(etcd3):
    """A growth 2 -> 3 on two launchers: the etcd leader is SIGKILLed as the
    joiner starts, so its JoinerReady and the admission go through an
    election. The resize completes: both launchers print the same v2 with
    the same three workers, every worker saw it, both exit 0."""
    job = f"grow-{uuid.uuid4().hex[:8]}"
    base = free_port_block(41, hosts=LOOPBACK_HOSTS)
    common = [
        "-np", "2", "--max-np", "3", "--elastic", "-H", "127.0.0.1:1,127.0.0.2:2", "--config-store", etcd3.url,
        "--admit-window", "0", "--port-range", f"{base}-{base + 40}", "--timeout", "30",
    ]
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job)
    with _Launchers(common, env) as launchers:
        procs, out, err = launchers.procs, launchers.out, launchers.err
        for name, host in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
            launchers.start(name, host, sys.executable, FAKE, "grow", "3")
        _wait_for(err["b"], r"started joiner", 60, "the joiner starts on B", procs["b"], launchers)
        etcd3.stop(etcd3.leader())
        rcs = {name: p.wait(90) for name, p in procs.items()}
    info = launchers.info()
    assert rcs == {"a": 0, "b": 0}, info
    v2 = [[line for line in err[n] if "cluster v2:" in line] for n in ("a", "b")]
    joiner = f"127.0.0.2:{base + 1}"  # B runs rank 1 at base (ports count per host)
    for lines in v2:  # each launcher reads why from the store: the same line on both
        assert lines == [f"[kungfu-run] cluster v2: 2 -> 3 workers (admitted {joiner})\n"], info
    assert not any("cluster v3" in line for n in ("a", "b") for line in err[n]), info
    seen = sorted(re.findall(r"^\[(\d)\] saw 3 workers at v2$", "".join(out["a"] + out["b"]), re.MULTILINE))
    assert seen == ["0", "1"], info
    assert "[2] admitted at v2 as rank 2 of 3\n" in out["b"], info


def test_a_launcher_that_never_registers_has_its_members_replaced(etcd3, tmp_path):
    """Host A's launcher never starts (as when it refused its --port-range): B alone
    registers, and after --timeout reports A's member of version 1 lost, saying why,
    and replaces it on its own host; the job ends whole at v3. A launcher of A that
    comes after all starts none of the old members and ends with the job (the
    members wait for it to have said so: on a loaded machine the job had ended
    before A started, and A rightly refused a job that had run to its end).
    (Before, B waited for A's member for ever: the job never changed or ended.)"""
    job = f"absent-{uuid.uuid4().hex[:8]}"
    base = free_port_block(41, hosts=LOOPBACK_HOSTS)
    common = [
        "-np", "3", "--elastic", "-H", "127.0.0.1:1,127.0.0.2:3", "--config-store", etcd3.url,
        "--admit-window", "0", "--port-range", f"{base}-{base + 40}", "--timeout", "5",
    ]
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job)
    with _Launchers(common, env) as launchers:
        launchers.start("b", "127.0.0.2", sys.executable, FAKE, "absent-first", str(tmp_path))
        _wait_for(launchers.err["b"], r"cluster v2:", 60, "B reports A's member lost", launchers.procs["b"], launchers)
        launchers.start("a", "127.0.0.1", sys.executable, FAKE, "absent-first", str(tmp_path))
        _wait_for(launchers.err["a"], r"not starting the members of version 1", 60, "A starts none of them",
                  launchers.procs["a"], launchers)  # fmt: skip
        (tmp_path / "go").touch()
        rcs = {name: p.wait(90) for name, p in launchers.procs.items()}
    info, err, out = launchers.info(), launchers.err, launchers.out
    assert rcs == {"a": 0, "b": 0}, info
    why = "the launcher of 127.0.0.1 did not register in --timeout 5 s"
    assert f"kungfu-run: {why}: reporting 127.0.0.1:{base} lost\n" in err["b"], info
    assert f"[kungfu-run] cluster v2: 3 -> 2 workers (lost 127.0.0.1:{base}: {why})\n" in err["b"], info
    assert f"[kungfu-run] cluster v3: 2 -> 3 workers (admitted 127.0.0.2:{base + 2})\n" in err["b"], info
    assert sorted(re.findall(r"^\[(\d)\] saw 3 workers at v3$", "".join(out["b"]), re.MULTILINE)) == ["1", "2"], info
    assert any("not starting the members of version 1 placed on 127.0.0.1" in line for line in err["a"]), info
    assert not out["a"], info  # A started no worker


def test_without_quorum_the_job_runs_on_and_a_resize_waits_until_it_is_back(etcd3, tmp_path):
    """A running job (one launcher, two members) loses two of its three etcd
    members: the members keep running at their size, the resize rank 0 asks
    for is refused with UNAVAILABLE saying why, and the launcher says that
    membership changes wait; one member restarted, the same resize commits,
    the joiner is admitted and the job ends well."""
    job = f"quorum-job-{uuid.uuid4().hex[:8]}"
    base = free_port_block(41)
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job)
    cmd = [
        sys.executable, "-m", "kungfu_tf.run", "-np", "2", "--max-np", "3", "--elastic", "-H", "127.0.0.1:3",
        "--config-store", etcd3.url, "--admit-window", "0", "--port-range", f"{base}-{base + 40}",
        "--timeout", "60", sys.executable, FAKE, "grow-on-signal", f"{tmp_path}:3",
    ]
    out: list[str] = []
    err: list[str] = []
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _reader(proc.stdout, out)
    _reader(proc.stderr, err)
    try:
        _wait_for(out, r"signature set", 60, "rank 0 started", proc)
        leader = etcd3.leader()
        down = [leader, next(i for i in range(3) if i != leader)]
        for i in down:
            etcd3.stop(i)
        (tmp_path / "go").touch()
        _wait_for(out, r"refused: UNAVAILABLE", 60, "the resize is refused", proc)
        _wait_for(err, r"membership changes wait until it has quorum again", 60, "the launcher says so", proc)
        assert proc.poll() is None and len(_children(proc.pid)) == 2, "the members stopped without quorum"
        etcd3.start(down[1])
        rc = proc.wait(90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    info = "".join(err) + "".join(out)
    assert rc == 0, info
    refused = next(line for line in out if "refused: UNAVAILABLE" in line)
    assert f"the config store {etcd3.url} cannot commit now, so membership changes wait" in refused, info
    assert "(training goes on at its size)" in refused, info
    assert re.search(r"cluster v2: 2 -> 3 workers \(admitted 127\.0\.0\.1:\d+\)", info), info
    assert sorted(re.findall(r"^\[(\d)\] saw 3 workers at v2$", "".join(out), re.MULTILINE)) == ["0", "1"], info


HOST_A, HOST_B = "10.217.0.1", "10.217.0.2"  # a /24 no other test uses


def test_training_survives_the_host_that_placed_its_workers(request, tmp_path):
    """The data job of test_elastic_data.py (real TF workers, 4 -> 2 -> 3, a
    crash, a replacement) on two emulated hosts (network namespaces) sharing
    a 3-member etcd (run on host A): host A runs rank 0 alone and holds the
    placer duty; at the crash, rank 0 SIGKILLs A's launcher, then itself.
    The survivors on B recover, B's launcher takes the duty over and places
    the replacement on B, and the job ends with every sample of every epoch
    trained exactly once and numpy's weights on the three workers that finish."""
    from test_elastic_data import check_trained_exactly_once, load_events, worker_plan

    two = make_two_hosts(request, HOST_A.rsplit(".", 1)[0], "kfc")
    etcd = EtcdCluster(tmp_path / "etcd", members=3, host=HOST_A, exec_prefix=two.exec_prefix(0))
    request.addfinalizer(etcd.close)
    job = f"data-{uuid.uuid4().hex[:8]}"
    common = [
        "-np", "4", "--elastic", "--min-np", "2", "--max-np", "4", "-H", f"{HOST_A}:1,{HOST_B}:4",
        "--config-store", etcd.url, "--timeout", "60",
    ]
    env = worker_env(
        KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job, ELASTIC_DATA_KILL_RANK="0", ELASTIC_DATA_KILL_LAUNCHER="1"
    )
    script = worker_path("elastic_data.py")
    with _Launchers(common, env) as launchers:
        procs, out, err = launchers.procs, launchers.out, launchers.err
        for i, (name, host) in enumerate((("a", HOST_A), ("b", HOST_B))):
            launchers.start(name, host, sys.executable, script, str(tmp_path), prefix=tuple(two.exec_prefix(i)))
            if name == "a":
                _wait_for(err["a"], r"places joiners and answers for lost launchers", 60, "A holds the duty", procs["a"], launchers)
        rc_b = procs["b"].wait(240)
        rc_a = procs["a"].wait(10)
    events = load_events(tmp_path)
    info = (
        f"--- A (rc {procs['a'].returncode}) ---\n{''.join(err['a'])}{''.join(out['a'])}\n"
        f"--- B (rc {procs['b'].returncode}) ---\n{''.join(err['b'])}{''.join(out['b'])}\n--- events ---\n"
        + "\n".join(map(json.dumps, events))
    )
    assert rc_a == -signal.SIGKILL, info
    assert rc_b == 0, info
    (kill,) = [e for e in events if e["event"] == "kill"]
    assert kill["peer"].startswith(f"{HOST_A}:") and kill["rank"] == 0, info
    check_trained_exactly_once(worker_plan(), events, info)
    b_err = "".join(err["b"])
    # The survivors reported the crash at once (not waiting for A's lease); the lease then gave B the duty.
    lost = re.search(rf"cluster v\d+: 3 -> 2 workers \(lost {re.escape(HOST_A)}:\d+: all_reduce 'elastic_data/step'", b_err)
    assert lost, info
    assert f"{HOST_B} places joiners and answers for lost launchers" in b_err[lost.end():], info  # the takeover
    assert re.search(rf"started joiner \[\d+\] {re.escape(HOST_B)}:\d+", b_err.split("places joiners")[1]), info
    assert all(e["peer"].startswith(f"{HOST_B}:") for e in events if e["event"] == "final"), info
