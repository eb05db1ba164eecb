"""Collectives across two real hosts: two network namespaces on a veth pair.

Host A (10.214.0.1) and host B (10.214.0.2) are Linux network namespaces
(see tests/netns.py); one ``kungfu-run -np 4 -H A:2,B:2`` runs in each, with
the same KUNGFU_JOB_SECRET, as a user would on two machines. Workers on one
host talk over the per-namespace abstract Unix sockets, across hosts over TCP
on the veth. Each worker (tests/workers/multihost_worker.py) checks its own
results against numpy and prints "checked N results".

* test_collectives_across_two_hosts: the configuration ops (ranks in -H
  order, 2 per host), then for every topology all_reduce (sum), broadcast
  from root 3 and all_gather of float32 tensors of 1, 1001 and 3 MiB.
* test_all_reduce_under_bandwidth_limit: a token-bucket filter of 200 Mbit/s
  on both ends of the veth; a 4 MiB all_reduce per topology must still be
  right (timing is not asserted).

Both also check the veth counters: the data really crossed between the hosts,
and that every worker authenticated the frames of its connections to the other
host, as it does by default (KUNGFU_AUTHENTICATE_FRAMES unset), saying so once.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netns import TwoHosts, make_two_hosts

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "workers" / "multihost_worker.py"

SUBNET = "10.214.0"  # test_launcher_multihost.py uses 10.213.0
SECRET = "5a" * 32
NP = 4
MiB = 1024 * 1024

TOPOLOGIES = 6
MATRIX_SIZES = 3  # 1, 1001 and 3 MiB of float32
# Keep in step with workers/multihost_worker.py: 6 configuration checks, then
# per topology set_topology + topology() + 3 collectives per size.
MATRIX_CHECKS = 6 + TOPOLOGIES * (2 + 3 * MATRIX_SIZES)
SHAPED_CHECKS = TOPOLOGIES * 2  # set_topology + one 4 MiB all_reduce

JOB_TIMEOUT = 240  # seconds, for both launchers together (4 TF workers on 2 cores, maybe loaded)
CHECKED = re.compile(r"^\[(\d+)\] checked (\d+) results$", re.MULTILINE)
WORKER_LINE = re.compile(r"^\[(\d+)\]", re.MULTILINE)
AUTHENTICATING = re.compile(
    r"^\[(\d+)\] kungfu: rank \1 \(\S+\) authenticates the frames of its connections to other hosts", re.MULTILINE
)


@pytest.fixture
def two_hosts(request) -> TwoHosts:
    return make_two_hosts(request, SUBNET, "kfc")


def launcher_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["KUNGFU_JOB_SECRET"] = SECRET
    env["KUNGFU_JOB_ID"] = "multihost-collectives"
    return env


def run_two_launchers(hosts: TwoHosts, mode: str, tmp_path: Path) -> dict[int, tuple[int, str, str]]:
    """One launcher per host; returns host index -> (exit code, stdout, stderr)."""
    a, b = hosts.addresses
    launcher = [sys.executable, "-m", "kungfu_tf.run", "-np", str(NP), "-H", f"{a}:2,{b}:2"]
    launcher += ["--timeout", "60"]
    with contextlib.ExitStack() as stack:
        # Whatever happens, nothing started here outlives the call.
        stack.callback(hosts.kill_all)
        procs: list[subprocess.Popen] = []
        files = []
        for i, addr in enumerate(hosts.addresses):
            out = stack.enter_context(open(tmp_path / f"{mode}-{i}.out", "w+"))
            err = stack.enter_context(open(tmp_path / f"{mode}-{i}.err", "w+"))
            files.append((out, err))
            cmd = [*hosts.exec_prefix(i), *launcher, "--self", addr, str(WORKER), f"{a},{b}", mode]
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=REPO_ROOT,
                    env=launcher_env(),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + JOB_TIMEOUT
        timed_out = False
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            hosts.kill_all()
            for p in procs:
                p.wait(timeout=10)
        results = {}
        for i, (p, (out, err)) in enumerate(zip(procs, files)):
            out.seek(0)
            err.seek(0)
            results[i] = (p.returncode, out.read(), err.read())
    if timed_out:
        pytest.fail(f"{mode}: launchers did not finish within {JOB_TIMEOUT}s (killed)\n" + describe(results))
    return results


def describe(results: dict[int, tuple[int, str, str]]) -> str:
    mismatches = [ln for _, _, err in results.values() for ln in err.splitlines() if "MISMATCH" in ln]
    return "\n".join(mismatches) + "\n" + "\n".join(
        f"=== host {i}: exit code {rc}\n--- stdout ---\n{out[-8000:]}\n--- stderr ---\n{err[-8000:]}"
        for i, (rc, out, err) in results.items()
    )


def assert_jobs_ok(results: dict[int, tuple[int, str, str]], checks: int) -> None:
    for i, (rc, _, _) in results.items():
        assert rc == 0, f"launcher on host {i} exited with {rc}\n" + describe(results)
    # Each launcher started (and relays) only its own host's workers.
    for i, (_, out, _) in results.items():
        ranks = {int(r) for r in WORKER_LINE.findall(out)}
        assert ranks == {2 * i, 2 * i + 1}, f"host {i} relayed ranks {ranks}\n" + describe(results)
    counts = {int(r): int(n) for _, out, _ in results.values() for r, n in CHECKED.findall(out)}
    assert counts == dict.fromkeys(range(NP), checks), f"checked counts {counts}\n" + describe(results)
    # Frame authentication is on by default between hosts: every worker has
    # a connection to the other host and says once that it authenticates it.
    said = [int(r) for _, out, err in results.values() for r in AUTHENTICATING.findall(out + err)]
    assert sorted(said) == list(range(NP)), f"ranks announcing frame authentication: {said}\n" + describe(results)


def test_collectives_across_two_hosts(two_hosts, tmp_path):
    before = [two_hosts.link_stats(i)["rx"]["bytes"] for i in range(2)]
    results = run_two_launchers(two_hosts, "matrix", tmp_path)
    assert_jobs_ok(results, MATRIX_CHECKS)
    # Each all_gather of 3 MiB brings both remote inputs to every host.
    received = [two_hosts.link_stats(i)["rx"]["bytes"] - before[i] for i in range(2)]
    floor = TOPOLOGIES * 2 * 3 * MiB
    assert all(r >= floor for r in received), f"veth rx bytes {received}, expected >= {floor}"


def test_all_reduce_under_bandwidth_limit(two_hosts, tmp_path):
    two_hosts.limit_bandwidth(rate="200mbit", burst="256kb", latency="50ms")
    results = run_two_launchers(two_hosts, "shaped", tmp_path)
    assert_jobs_ok(results, SHAPED_CHECKS)
    # The filters were in force and carried the traffic: for the sums on the
    # other host to be right, at least the 4 MiB partial sum of this host's
    # inputs must leave it for every all_reduce.
    for i in range(2):
        q = two_hosts.qdisc_stats(i)
        assert q["kind"] == "tbf", q
        assert q["options"]["rate"] == 200_000_000 // 8, q
        assert q["bytes"] >= TOPOLOGIES * 4 * MiB, f"host {i}: tbf sent only {q['bytes']} bytes"
