"""Worker for tests/test_multihost_collectives.py: collectives across two hosts.

Usage: multihost_worker.py HOST_A,HOST_B MODE

Runs as one of 4 workers, 2 on each host (the hosts are network namespaces).

MODE "matrix": checks the configuration ops (rank order follows the -H order,
2 workers per host), then for every topology (switched with set_topology on
all workers) all_reduce (sum), broadcast from root 3 and all_gather of float32
tensors of 1, 1001 and 3 MiB (several chunks) elements.

MODE "shaped": the veth between the hosts is rate-limited by the test; one
4 MiB all_reduce (sum) per topology.

Inputs are deterministic per (case, rank), so every worker computes every
expected result with numpy. The float32 inputs are multiples of 1/8 below
2**17 in magnitude: sums of 4 are exact in any order, so results are compared
exactly. Ends with "checked N results"; the test knows N.
"""

from __future__ import annotations

import os
import sys
import time
import zlib

import numpy as np
import tensorflow as tf

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(2)

from kungfu_tf import ops  # after the threading config

TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE", "AUTO")
MATRIX_SIZES = (1, 1001, 3 * 1024 * 1024 // 4)  # float32 elements; the last is 3 MiB
SHAPED_SIZE = 4 * 1024 * 1024 // 4  # 4 MiB
ROOT = 3
NP = 4
PER_HOST = 2


def make_input(case: str, rank: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(zlib.crc32(f"{case}/{rank}".encode()))
    return (rng.integers(-(2**20), 2**20, n) / 8).astype(np.float32)


class Checker:
    def __init__(self, rank: int):
        self.rank = rank
        self.count = 0

    def fail(self, what: str) -> None:
        print(f"MISMATCH on rank {self.rank}: {what}", file=sys.stderr, flush=True)
        sys.exit(1)

    def true(self, cond: bool, what: str) -> None:
        if not cond:
            self.fail(what)
        self.count += 1

    def equal(self, got: np.ndarray, want: np.ndarray, what: str) -> None:
        if got.shape != want.shape or got.dtype != want.dtype:
            self.fail(f"{what}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}")
        if not np.array_equal(got, want):
            bad = np.nonzero(got.reshape(-1) != want.reshape(-1))[0]
            first = bad[:5].tolist()
            self.fail(
                f"{what}: {len(bad)} of {want.size} elements differ; first at {first}: "
                f"got {got.reshape(-1)[first].tolist()} want {want.reshape(-1)[first].tolist()}"
            )
        self.count += 1


def check_config(c: Checker, rank: int, hosts: list[str]) -> None:
    c.true(int(ops.rank()) == rank, f"rank() {int(ops.rank())} != KUNGFU_RANK {rank}")
    c.true(int(ops.cluster_size()) == NP, f"cluster_size() {int(ops.cluster_size())} != {NP}")
    c.true(int(ops.local_rank()) == rank % PER_HOST, f"local_rank() {int(ops.local_rank())} on rank {rank}")
    c.true(int(ops.local_size()) == PER_HOST, f"local_size() {int(ops.local_size())} != {PER_HOST}")
    # -H lists host A then host B: ranks 0, 1 on A and 2, 3 on B.
    me = os.environ["KUNGFU_SELF"].rsplit(":", 1)[0]
    c.true(me == hosts[rank // PER_HOST], f"rank {rank} runs on {me}")
    peer_hosts = [p.rsplit(":", 1)[0] for p in os.environ["KUNGFU_PEERS"].split(",")]
    want = [h for h in hosts for _ in range(PER_HOST)]
    c.true(peer_hosts == want, f"peer hosts {peer_hosts} != {want}")


def run_matrix(c: Checker, rank: int) -> None:
    ranks = range(NP)
    for topology in TOPOLOGIES:
        c.true(bool(ops.set_topology(topology)), f"set_topology({topology}) was refused")
        got_topology = ops.topology().numpy().decode()
        c.true(got_topology == topology, f"topology() {got_topology!r} after set_topology({topology!r})")
        for n in MATRIX_SIZES:
            case = f"{topology}/all_reduce/{n}"
            xs = [make_input(case, r, n) for r in ranks]
            got = ops.all_reduce(tf.constant(xs[rank]), op="sum").numpy()
            c.equal(got, np.sum(np.stack(xs), axis=0, dtype=np.float32), case)

            case = f"{topology}/broadcast/{n}"
            xs = [make_input(case, r, n) for r in ranks]
            got = ops.broadcast(tf.constant(xs[rank]), root=ROOT).numpy()
            c.equal(got, xs[ROOT], case)

            case = f"{topology}/all_gather/{n}"
            xs = [make_input(case, r, n) for r in ranks]
            got = ops.all_gather(tf.constant(xs[rank])).numpy()
            c.equal(got, np.stack(xs), case)


def run_shaped(c: Checker, rank: int) -> None:
    for topology in TOPOLOGIES:
        c.true(bool(ops.set_topology(topology)), f"set_topology({topology}) was refused")
        case = f"shaped/{topology}/all_reduce/{SHAPED_SIZE}"
        xs = [make_input(case, r, SHAPED_SIZE) for r in range(NP)]
        x = tf.constant(xs[rank])
        t0 = time.monotonic()
        got = ops.all_reduce(x, op="sum").numpy()
        elapsed = time.monotonic() - t0
        c.equal(got, np.sum(np.stack(xs), axis=0, dtype=np.float32), case)
        print(f"{topology}: 4 MiB all_reduce in {elapsed:.3f}s", flush=True)  # informational


def main() -> None:
    hosts = sys.argv[1].split(",")
    mode = sys.argv[2]
    rank = int(os.environ["KUNGFU_RANK"])
    c = Checker(rank)
    if mode == "matrix":
        check_config(c, rank, hosts)
        run_matrix(c, rank)
    elif mode == "shaped":
        run_shaped(c, rank)
    else:
        c.fail(f"unknown mode {mode!r}")
    print(f"checked {c.count} results", flush=True)


if __name__ == "__main__":
    main()
