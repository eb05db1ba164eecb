"""How long an elastic job with ``--config-store etcd://...`` takes to recover from each failure.

Real etcd members (3, on loopback, benchmarks/harness/etcd_cluster.py) and
real launchers; every number is measured in this run:

* **commit latency**: one membership change (a RequestSize call) to the
  embedded config service (the default, state in its memory) and to one
  backed by etcd (load, apply, compare-and-set: a Raft round), side by
  side: what the replicated store costs per change;
* **launcher host lost**: two launchers on loopback as two hosts
  (127.0.0.1 with rank 0 and the placer duty, 127.0.0.2 with ranks 1, 2);
  SIGKILL the first launcher and its worker; measured on the survivor's
  output: until the lost member is committed out (v2: the lease TTL
  dominates), and until its replacement is admitted (v3);
* **etcd leader killed**: a writer commits changes in a loop; SIGKILL the
  leader; the longest gap between two commits across the kill;
* **majority lost, one member back**: two of three members stopped (a
  change fails with UNAVAILABLE at once), then one restarted: until the
  next change commits.

Usage: ``python -m benchmarks.config_store [--repeats N]``; prints the table
that docs/guide/benchmarks.md quotes, with the machine's load.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from benchmarks.harness.etcd_cluster import EtcdCluster
from benchmarks.harness.paths import REPO
from benchmarks.harness.port_block import free_port_block
from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import ConfigClient, ConfigServer
from kungfu_tf.run.control.etcd_client import EtcdClient
from kungfu_tf.run.control.etcd_job_store import LAUNCHER_LEASE_SECONDS, EtcdJobStore
from kungfu_tf.run.control.job_state import JobStateMachine
from kungfu_tf.run.control.peer_string import parse_peer_string
from kungfu_tf.run.control.stored_job_state import (
    StoredJobStateMachine,
    StoreUnavailableJobError,
)

WORKER = Path(__file__).with_name("worker.py")
SECRET = "0123456789abcdef" * 4


def _initial(n: int = 2, max_size: int = 64) -> JobStateMachine:
    workers = [parse_peer_string(f"h:{i + 1}") for i in range(n)]
    return JobStateMachine(config_pb2.Cluster(version=1, workers=workers), elastic=True, max_size=max_size)


def _store(cluster: EtcdCluster, job: str) -> EtcdJobStore:
    return EtcdJobStore(EtcdClient(cluster.endpoints), job_id=job, secret=SECRET, log=lambda _: None)


def commit_latency(cluster: EtcdCluster, changes: int = 200) -> tuple[float, float]:
    """Median seconds of one RequestSize call to a config service: embedded, and backed by etcd."""
    store = _store(cluster, f"lat-{uuid.uuid4().hex[:8]}")
    stored = StoredJobStateMachine(store, _initial())
    embedded = ConfigServer(secret=SECRET, job_id="lat", elastic=True, max_size=64, cluster=_initial().cluster())
    backed = ConfigServer(secret=SECRET, job_id="lat", jobs=stored)
    results = []
    for server in (embedded, backed):
        with server, ConfigClient(server.address, secret=SECRET, job_id="lat") as client:
            times = []
            for i in range(changes):
                start = time.perf_counter()
                client.request_size(2 + i % 2)
                times.append(time.perf_counter() - start)
        results.append(statistics.median(times))
    stored.close()
    store.close()
    return results[0], results[1]


def leader_kill_gap(cluster: EtcdCluster) -> float:
    """Longest gap between two committed changes across a SIGKILL of the etcd leader."""
    store = _store(cluster, f"leader-{uuid.uuid4().hex[:8]}")
    stored = StoredJobStateMachine(store, _initial())
    commits: list[float] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                stored.request_size(2 + i % 2)
                commits.append(time.monotonic())
                i += 1
            except StoreUnavailableJobError:
                time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(1.0)
    leader = cluster.leader()
    killed_at = time.monotonic()
    cluster.stop(leader)
    while not commits or commits[-1] < killed_at + 2.0:
        time.sleep(0.05)
    stop.set()
    thread.join()
    cluster.start(leader)
    stored.close()
    store.close()
    around = [t for t in commits if t >= killed_at - 1.0]
    return max(b - a for a, b in itertools.pairwise(around))


def majority_recovery(cluster: EtcdCluster) -> tuple[str, float]:
    """Stop two of three members: the refusal's message; restart one: seconds until a change commits."""
    store = _store(cluster, f"quorum-{uuid.uuid4().hex[:8]}")
    stored = StoredJobStateMachine(store, _initial())
    leader = cluster.leader()
    down = [leader, next(i for i in range(3) if i != leader)]
    for i in down:
        cluster.stop(i)
    try:
        stored.request_size(3)
        refusal = "(committed: quorum was not lost?)"
    except StoreUnavailableJobError as e:
        refusal = str(e)
    restarted_at = time.monotonic()
    cluster.start(down[1], wait=False)
    while True:
        try:
            stored.request_size(3)
            break
        except StoreUnavailableJobError:
            time.sleep(0.05)
    recovery = time.monotonic() - restarted_at
    cluster.start(down[0])
    stored.close()
    store.close()
    return refusal, recovery


def host_loss(cluster: EtcdCluster, port_base: int) -> tuple[float, float]:
    """Seconds from SIGKILL of launcher A (and its worker) to v2 (lost) and v3 (replaced) on B."""
    job = f"host-{uuid.uuid4().hex[:8]}"
    common = [
        "-np", "3", "--elastic", "-H", "127.0.0.1:1,127.0.0.2:3", "--config-store", cluster.url,
        "--admit-window", "0", "--port-range", f"{port_base}-{port_base + 40}", "--timeout", "30",
        "--status-every", "0",
    ]
    env = dict(os.environ, KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job, PYTHONPATH=str(REPO))
    lines: dict[str, list[tuple[float, str]]] = {"a": [], "b": []}
    procs = {}

    def read(name: str, stream) -> None:
        for line in stream:
            lines[name].append((time.monotonic(), line))

    def wait_for(name: str, pattern: str, timeout: float = 60) -> float:
        deadline = time.monotonic() + timeout
        while True:
            for t, line in list(lines[name]):
                if re.search(pattern, line):
                    return t
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {pattern!r} from launcher {name}: {''.join(x for _, x in lines[name])}")
            time.sleep(0.02)

    try:
        for name, host in (("a", "127.0.0.1"), ("b", "127.0.0.2")):
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "kungfu_tf.run", *common, "--self", host, sys.executable, str(WORKER)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, start_new_session=True,
            )
            threading.Thread(target=read, args=(name, procs[name].stdout), daemon=True).start()
            if name == "a":
                wait_for("a", "places joiners")
        wait_for("a", r"\bready$")
        wait_for("b", r"live launchers: 127\.0\.0\.1, 127\.0\.0\.2")
        children = open(f"/proc/{procs['a'].pid}/task/{procs['a'].pid}/children").read().split()  # noqa: SIM115
        killed_at = time.monotonic()
        os.kill(procs["a"].pid, signal.SIGKILL)
        for pid in children:
            os.kill(int(pid), signal.SIGKILL)
        lost = wait_for("b", r"cluster v2: 3 -> 2 workers") - killed_at
        whole = wait_for("b", r"cluster v3: 2 -> 3 workers") - killed_at
        if procs["b"].wait(60) != 0:
            raise RuntimeError(f"launcher B failed: {''.join(x for _, x in lines['b'])}")
        return lost, whole
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each failure (median reported)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows: dict[str, list] = {"mem": [], "etcd": [], "leader": [], "majority": [], "lost": [], "whole": []}
    refusal = ""
    base = free_port_block(50 * args.repeats, hosts=("127.0.0.1", "127.0.0.2"))
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            cluster = EtcdCluster(Path(tmp) / f"run{r}", members=3)
            try:
                mem, etcd = commit_latency(cluster)
                rows["mem"].append(mem)
                rows["etcd"].append(etcd)
                lost, whole = host_loss(cluster, base + 50 * r)
                rows["lost"].append(lost)
                rows["whole"].append(whole)
                rows["leader"].append(leader_kill_gap(cluster))
                refusal, recovery = majority_recovery(cluster)
                rows["majority"].append(recovery)
            finally:
                cluster.close()
            print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.4f}" for k, v in rows.items()), flush=True)
    load_after = os.getloadavg()

    def med(key: str) -> float:
        return statistics.median(rows[key])

    def runs(key: str, scale: float = 1.0) -> str:
        return ", ".join(f"{v * scale:.2f}" for v in rows[key])

    print()
    print(f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min); "
          f"`uptime`: {subprocess.run(['uptime'], capture_output=True, text=True, check=False).stdout.strip()}")
    print(f"medians of {args.repeats} runs, 3 etcd members on loopback, lease TTL {LAUNCHER_LEASE_SECONDS} s")
    print()
    print("| what | measured | runs |")
    print("|---|---|---|")
    print(f"| one membership change (RequestSize), embedded config service | {med('mem') * 1e3:.2f} ms | {runs('mem', 1e3)} |")
    print(f"| one membership change (RequestSize), config service on etcd | {med('etcd') * 1e3:.2f} ms "
          f"({med('etcd') / med('mem'):.1f}× embedded) | {runs('etcd', 1e3)} |")
    print(f"| launcher host lost → member committed out (v2) | {med('lost'):.2f} s | {runs('lost')} |")
    print(f"| launcher host lost → replacement admitted (v3) | {med('whole'):.2f} s | {runs('whole')} |")
    print(f"| etcd leader killed → longest gap between commits | {med('leader'):.2f} s | {runs('leader')} |")
    print(f"| majority lost, one member restarted → next commit | {med('majority'):.2f} s | {runs('majority')} |")
    print()
    print(f"while the majority was lost, a change answered: {refusal[:300]}")
    return 0
