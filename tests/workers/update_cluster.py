"""Worker for test_update_cluster.py: three workers under kungfu-run (np=3)
plus one joiner the test starts itself (argument "joiner": a one-worker
cluster of its own at version 0, as a launcher starts one).

Usage: update_cluster.py DIR [joiner]

Versions count from the launcher's (v0); the workers meet through files in DIR:
 1. v0, 3 workers: all-reduce; rank 0 writes DIR/job.json (peers, job id).
 2. shrink to 2 (v0+1): rank 2 leaves the cluster and ends; ranks 0, 1 switch.
 3. grow to 3 (v0+2): the joiner runs an all-reduce alone, writes
    DIR/joiner.json (its self_peer) and waits for DIR/grow.json; ranks 0, 1
    append it and switch, as does the joiner.
 4. interrupt: rank 0 blocks in an all-reduce nobody else joins; a thread
    interrupts it, which must fail it at once (and new ops too); then
    everyone switches to v0+3 and all-reduces again.
After every switch: rank(), cluster_size(), cluster_version(),
cluster_peers(), lost_peers() and an all-reduce against numpy. Each member
prints "switch <version> <ms>" (update_cluster + first all-reduce) and
"checked N results".
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import threading
import time

import _setup
from _setup import Checker, np, ops, tf

from kungfu_tf.ops import config, membership

WAIT_SECONDS = 60


def wait_for_file(path: pathlib.Path) -> dict:
    deadline = time.monotonic() + WAIT_SECONDS
    while not path.exists():
        if time.monotonic() > deadline:
            sys.exit(f"no {path} after {WAIT_SECONDS} s")
        time.sleep(0.01)
    return json.loads(path.read_text())


def write_file(path: pathlib.Path, value: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.rename(path)


def contribution(peer: str, universe: list[str]) -> np.ndarray:
    """What `peer` all-reduces: a function of who it is, not of its rank."""
    return (universe.index(peer) + 1) * np.arange(1, 9, dtype=np.float32)


def check_cluster(chk: Checker, peers: list[str], version: int, universe: list[str], name: str) -> None:
    me = membership.self_peer()
    chk.equal(int(config.rank()), peers.index(me), f"{name}: rank")
    chk.equal(int(config.cluster_size()), len(peers), f"{name}: cluster_size")
    chk.equal(int(config.cluster_version()), version, f"{name}: cluster_version")
    chk.true(membership.cluster_peers() == peers, f"{name}: cluster_peers")
    chk.true(membership.lost_peers() == [], f"{name}: lost_peers")
    got = ops.all_reduce(tf.constant(contribution(me, universe)), name=name).numpy()
    chk.equal(got, sum(contribution(p, universe) for p in peers), f"{name}: all_reduce")


def switch(chk: Checker, peers: list[str], version: int, universe: list[str], name: str) -> None:
    start = time.perf_counter()
    membership.update_cluster(peers, version)
    me = membership.self_peer()
    got = ops.all_reduce(tf.constant(contribution(me, universe)), name=name + "/first").numpy()
    print(f"switch {version} {1e3 * (time.perf_counter() - start):.1f}", flush=True)
    chk.equal(got, sum(contribution(p, universe) for p in peers), f"{name}: first all_reduce")
    check_cluster(chk, peers, version, universe, name)


def interrupt_blocked_all_reduce(chk: Checker) -> None:
    reason = "interrupted by the test's watcher"
    threading.Timer(0.3, membership.interrupt, args=(reason,)).start()
    start = time.monotonic()
    try:
        ops.all_reduce(tf.ones([4]), name="nobody else joins this")
        chk.fail("the blocked all_reduce was not interrupted")
    except tf.errors.UnavailableError as e:
        chk.true(reason in e.message, f"interrupt reason in {e.message!r}")
    chk.true(time.monotonic() - start < 3, "interrupt failed the blocked all_reduce fast")
    try:
        ops.all_reduce(tf.ones([4]), name="after the interrupt")
        chk.fail("an op after interrupt() ran")
    except tf.errors.UnavailableError as e:
        chk.true(reason in e.message, f"new op refused with {e.message!r}")


def member(d: pathlib.Path, chk: Checker) -> None:
    rank = _setup.env_rank()
    peers = os.environ["KUNGFU_PEERS"].split(",")
    v0 = int(config.cluster_version())
    universe = list(peers)
    check_cluster(chk, peers, v0, universe, "start")
    if rank == 0:
        write_file(d / "job.json", {"peers": peers, "job_id": os.environ["KUNGFU_JOB_ID"], "version": v0})
    if rank == 2:
        membership.leave_cluster()
        return
    two = peers[:2]
    switch(chk, two, v0 + 1, universe, "shrunk")
    joiner = wait_for_file(d / "joiner.json")["self"]
    universe.append(joiner)
    three = [*two, joiner]
    if rank == 0:
        write_file(d / "grow.json", {"peers": three, "version": v0 + 2})
    switch(chk, three, v0 + 2, universe, "grown")
    after_interrupt(d, chk, three, v0 + 3, universe, interrupting=rank == 0)


def after_interrupt(
    d: pathlib.Path, chk: Checker, peers: list[str], version: int, universe: list[str], interrupting: bool
) -> None:
    if interrupting:
        interrupt_blocked_all_reduce(chk)
        write_file(d / "interrupted.json", {})
    else:
        # Not before: our switch would fail rank 0's blocked op first.
        wait_for_file(d / "interrupted.json")
    switch(chk, peers, version, universe, "after interrupt")


def joiner(d: pathlib.Path, chk: Checker) -> None:
    me = membership.self_peer()
    chk.true(membership.cluster_peers() == [me] and int(config.cluster_version()) == 0, "joiner starts alone")
    chk.equal(ops.all_reduce(tf.ones([2]), name="warm-up").numpy(), [1, 1], "joiner warm-up alone")
    write_file(d / "joiner.json", {"self": me})
    job = wait_for_file(d / "job.json")
    grow = wait_for_file(d / "grow.json")
    universe = [*job["peers"], me]
    switch(chk, grow["peers"], grow["version"], universe, "grown")
    after_interrupt(d, chk, grow["peers"], grow["version"] + 1, universe, interrupting=False)


def main() -> None:
    d = pathlib.Path(sys.argv[1])
    is_joiner = sys.argv[2:] == ["joiner"]
    chk = Checker(-1 if is_joiner else _setup.env_rank())
    (joiner if is_joiner else member)(d, chk)
    chk.done()


if __name__ == "__main__":
    main()
