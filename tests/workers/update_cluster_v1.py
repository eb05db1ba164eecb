"""Worker for test_update_cluster.py::test_v1_graph_mode_reads_the_new_cluster.

Usage: update_cluster_v1.py OTHER_PEER

A one-worker cluster (KUNGFU_PEERS = KUNGFU_SELF) with eager execution
disabled, as in a tf.compat.v1 program: it switches (in a session) to a
two-worker cluster [OTHER_PEER, self] at version 1. No op talks to the other
peer (connections open on first use), so it need not exist. kungfu_tf.rank()
and friends must then read the new cluster, not the launcher's environment.
Prints "rank R size S local L/N version V" and "checked N results".
"""

from __future__ import annotations

import os
import sys

import _setup
from _setup import Checker, tf

tf.compat.v1.disable_eager_execution()

import kungfu_tf
from kungfu_tf.ops import config, membership


def main() -> None:
    other, me = sys.argv[1], os.environ["KUNGFU_SELF"]
    chk = Checker(0)
    chk.true((kungfu_tf.rank(), kungfu_tf.size()) == (0, 1), "alone at first")
    with tf.compat.v1.Session(config=_setup.session_config()) as session:
        session.run(membership.update_cluster([other, me], 1))
        version = session.run(config.cluster_version())
    got = (kungfu_tf.rank(), kungfu_tf.size(), kungfu_tf.local_rank(), kungfu_tf.local_size(), version)
    print("rank {} size {} local {}/{} version {}".format(*got), flush=True)
    chk.equal(got, (1, 2, 1, 2, 1), "rank, size, local rank, local size and version after the change")
    chk.done()


if __name__ == "__main__":
    main()
