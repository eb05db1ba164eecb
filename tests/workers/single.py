"""Worker for test_failures.py::test_without_launcher: run directly, no kungfu-run.

Usage: single.py

Without KUNGFU_* variables the runtime is a one-worker cluster: rank 0 of 1,
every collective returns its input (all-gather adds an axis of size 1),
consensus is True, set_topology works, p2p save/request reaches ourselves.
Ends with "checked N results".
"""

from __future__ import annotations

import os

from _setup import DTYPES, FLOAT_DTYPES, Checker, make_input, np, ops, tf

import kungfu_tf


def main() -> None:
    leftover = sorted(k for k in os.environ if k.startswith("KUNGFU_"))
    chk = Checker(0)
    chk.true(not leftover, f"KUNGFU_* variables are set: {leftover}")
    for fn, want in ((kungfu_tf.rank, 0), (kungfu_tf.size, 1), (kungfu_tf.local_rank, 0), (kungfu_tf.local_size, 1)):
        chk.equal(fn(), want, f"kungfu_tf.{fn.__name__}()")
    for fn, want in ((ops.rank, 0), (ops.cluster_size, 1), (ops.local_rank, 0), (ops.local_size, 1)):
        chk.equal(int(fn()), want, f"ops.{fn.__name__}()")
    chk.equal(ops.topology().numpy().decode(), "AUTO", "default topology")

    for dt in DTYPES:
        x = make_input(f"single/{dt}", 0, (7, 11, 13), dt, "small")
        for op in ("sum", "min", "max", "prod", "mean"):
            if op == "mean" and dt not in FLOAT_DTYPES:
                continue
            chk.equal(ops.all_reduce(tf.constant(x), op=op).numpy(), x, f"all_reduce {op} {dt}")
        chk.equal(ops.broadcast(tf.constant(x), root=0).numpy(), x, f"broadcast {dt}")
        chk.equal(ops.all_gather(tf.constant(x)).numpy(), x[None], f"all_gather {dt}")
        chk.equal(bool(ops.consensus(tf.constant(x)).numpy()), True, f"consensus {dt}")
    xs = [tf.constant(make_input(f"group/{dt}", 0, (5,), dt, "small")) for dt in DTYPES]
    for got, x in zip(ops.group_all_reduce(xs, op="sum"), xs):
        chk.equal(got.numpy(), x.numpy(), f"group_all_reduce {x.dtype.name}")

    @tf.function
    def in_graph(x):
        return ops.all_reduce(x, op="max"), ops.cluster_size(), ops.rank()

    y, n, r = in_graph(tf.constant([1.5, -2.0]))
    chk.equal(y.numpy(), np.array([1.5, -2.0], np.float32), "tf.function all_reduce")
    chk.equal((int(n), int(r)), (1, 0), "tf.function cluster_size/rank")

    try:
        ops.broadcast(tf.ones([2]), root=1)
    except tf.errors.InvalidArgumentError as e:
        chk.true("root 1" in e.message, f"broadcast root error: {e.message}")
    else:
        chk.fail("broadcast from root 1 in a one-worker cluster succeeded")

    ops.barrier()
    chk.true(bool(ops.set_topology("ring").numpy()), "set_topology('ring')")
    chk.equal(ops.topology().numpy().decode(), "RING", "topology after set_topology('ring')")
    try:
        ops.set_topology("MESH")
    except ValueError:
        chk.true(True, "")
    else:
        chk.fail("set_topology('MESH') did not raise ValueError")
    chk.equal(ops.all_reduce(tf.constant([4, 5]), name="named").numpy(), [4, 5], "named all_reduce")

    ops.save("w", tf.constant([1.0, 2.0, 3.0]))
    got = ops.request(0, "w", like=tf.zeros([3])).numpy()
    chk.equal(got, np.array([1.0, 2.0, 3.0], np.float32), "p2p request from self")
    rates = ops.comm_rates().numpy()
    chk.equal(rates, np.zeros(1), "comm_rates() of a one-worker cluster")
    chk.done()


if __name__ == "__main__":
    main()
