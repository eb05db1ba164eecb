"""Worker for tests/test_reduce.py: reduce to a root.

Usage: reduce_root.py

For root 0 and root np-1, eagerly and in one tf.function: ops.reduce with
every op (sum, min, max, prod; mean on floats) on every dtype for the shapes
[] and [7, 11, 13], plus one float32 sum of 300001 elements (several 1 MiB
chunks). On the root the output must be numpy's reduction; on every other
worker it must be that worker's own input, unchanged. The same for a few
cases on RING and BINARY_TREE, where non-roots also pass partial results on.

Then the traffic, from the runtime's byte counters (ops.comm_bytes), on a
STAR topology: a reduce of B bytes to root np-1 makes each other worker send
about B bytes to the root and nothing to anyone else, and the root send
nothing; an all-reduce of the same B bytes, for contrast, makes the root
send about B bytes to every worker. Finally a root outside the cluster fails
with InvalidArgumentError naming the key and the root. Last, in a
tf.function, non-roots pass their (unused) reduce output to ops.keep_alive
and the root must still receive every contribution.

Ends with "checked N results" (see expected_checks() in the test).
"""

from __future__ import annotations

import _setup
from _setup import (
    DTYPES,
    FLOAT_DTYPES,
    Checker,
    make_input,
    np,
    ops,
    reduce_ref,
    tf,
    tolerance,
)

SHAPES = ((), (7, 11, 13))
REDUCE_OPS = ("sum", "min", "max", "prod", "mean")
INPUT_KIND = {"sum": "real", "mean": "real", "prod": "small", "min": "big", "max": "big"}
INNER_NODE_TOPOLOGIES = ("RING", "BINARY_TREE")
TRAFFIC_ELEMS = 250_000  # 1 MB of float32: one piece at the default chunk size
SLACK = 2048  # frame headers and keys, and at most a barrier frame racing the measurement


def build_cases(tag: str, root: int, rank: int, size: int):
    """(label, op, this rank's input, expected output, atol or None) for one root."""
    cases = []
    specs = [(dt, shape, op) for dt in DTYPES for shape in SHAPES for op in REDUCE_OPS
             if op != "mean" or dt in FLOAT_DTYPES]
    specs.append(("float32", (300001,), "sum"))
    for dt, shape, op in specs:
        label = f"{tag}/root{root}/{op}/{dt}/{shape}"
        xs = [make_input(label, r, shape, dt, INPUT_KIND[op]) for r in range(size)]
        if rank == root:
            inexact = dt in FLOAT_DTYPES and op in ("sum", "mean")
            cases.append((label, op, xs[rank], reduce_ref(xs, op, dt), tolerance(dt, size) if inexact else None))
        else:
            cases.append((label, op, xs[rank], xs[rank], None))
    return cases


def check(chk: Checker, cases, outs) -> None:
    for (label, _, mine, want, atol), got in zip(cases, outs):
        got = np.asarray(got)
        if got.dtype != mine.dtype:
            chk.fail(label, f"dtype {got.dtype}, expected {mine.dtype}")
        if atol is None:
            chk.equal(got, want, label)
        else:
            chk.close(got, want, atol, label)


def run_collectives(chk: Checker, rank: int, size: int) -> None:
    for root in sorted({0, size - 1}):
        cases = build_cases("eager", root, rank, size)
        check(chk, cases, [ops.reduce(tf.constant(x), root=root, op=op).numpy() for _, op, x, _, _ in cases])

        cases = build_cases("function", root, rank, size)

        @tf.function(autograph=False)
        def step(xs, root=root, cases=cases):
            return [ops.reduce(x, root=root, op=op) for x, (_, op, _, _, _) in zip(xs, cases)]

        outs = step([tf.constant(x) for _, _, x, _, _ in cases])
        check(chk, cases, [o.numpy() for o in outs])


def run_inner_nodes(chk: Checker, rank: int, size: int) -> None:
    """On a chain (RING) or a tree, non-roots also combine what passes through
    them: their outputs must still be their own inputs."""
    specs = (((300001,), "float32", "sum"), ((7, 11, 13), "int32", "max"), ((), "float64", "mean"))
    root = size - 1
    for topo in INNER_NODE_TOPOLOGIES:
        chk.true(bool(ops.set_topology(topo).numpy()), f"set_topology({topo})")
        for shape, dt, op in specs:
            label = f"{topo}/{op}/{dt}/{shape}"
            xs = [make_input(label, r, shape, dt, INPUT_KIND[op]) for r in range(size)]
            got = ops.reduce(tf.constant(xs[rank]), root=root, op=op).numpy()
            if rank != root:
                chk.equal(got, xs[rank], label)
            elif dt == "int32":
                chk.equal(got, reduce_ref(xs, op, dt), label)
            else:
                chk.close(got, reduce_ref(xs, op, dt), tolerance(dt, size), label)


def counters() -> tuple[np.ndarray, np.ndarray]:
    sent, received = ops.comm_bytes()
    return sent.numpy(), received.numpy()


def traffic(fn, barrier_name: str):
    """Bytes sent per peer by ``fn()`` alone, and bytes received per peer around it.

    Sends are counted from after a barrier, so they are exactly ours. Receives
    are counted from before it: a peer leaves the barrier and sends at once,
    possibly before we could read the counters, so the window includes the
    barrier's own small frames.
    """
    _, received0 = counters()
    ops.barrier(name=barrier_name)
    sent0, _ = counters()
    fn()
    sent1, received1 = counters()
    return sent1 - sent0, received1 - received0


def check_traffic(chk: Checker, rank: int, size: int) -> None:
    chk.true(bool(ops.set_topology("STAR").numpy()), "set_topology(STAR)")
    root = size - 1
    x = tf.constant(make_input("traffic", rank, (TRAFFIC_ELEMS,), "float32", "real"))
    b = TRAFFIC_ELEMS * 4
    sent, received = traffic(lambda: ops.reduce(x, root=root, name="traffic_reduce"), "before_reduce")
    print(f"reduce of {b} bytes to rank {root}: sent {sent.tolist()} received {received.tolist()}", flush=True)
    if rank == root:
        ok = (sent == 0).all() and all(b <= received[p] <= b + SLACK for p in range(size) if p != root)
    else:
        ok = b <= sent[root] <= b + SLACK and all(sent[p] == 0 for p in range(size) if p != root)
    chk.true(bool(ok), f"reduce traffic on rank {rank}: sent {sent.tolist()}, received {received.tolist()}")

    sent, _ = traffic(lambda: ops.all_reduce(x, name="traffic_all_reduce"), "before_all_reduce")
    print(f"all-reduce of {b} bytes: sent {sent.tolist()}", flush=True)
    if rank == 0:  # the star's centre sends the result back to everyone
        ok = all(sent[p] >= b for p in range(size) if p != 0)
        chk.true(bool(ok), f"all-reduce traffic on rank 0: sent {sent.tolist()}")
    else:
        chk.true(b <= sent[0] <= b + SLACK, f"all-reduce traffic on rank {rank}: sent {sent.tolist()}")
    ops.barrier(name="after_traffic")


def check_bad_root(chk: Checker, size: int) -> None:
    try:
        ops.reduce(tf.ones([3]), root=size, name="bad_root")
    except tf.errors.InvalidArgumentError as e:
        chk.true("'bad_root'" in e.message and f"root {size}" in e.message, f"error text: {e.message}")
    else:
        chk.fail(f"reduce to root {size} in a cluster of {size} succeeded")
    try:
        ops.reduce(tf.ones([3]), root=-1)
    except ValueError:
        chk.true(True, "")
    else:
        chk.fail("reduce(root=-1) did not raise ValueError")


KEEP_ALIVE_STEPS = 3


def check_keep_alive(chk: Checker, rank: int, size: int) -> None:
    """A non-root's reduce whose result it never uses still runs when passed to keep_alive.

    Inside a tf.function such an op would otherwise be pruned (or turned into
    a NoOp by Grappler), and the root would wait for it until the timeout.
    """
    root = 0
    x = tf.constant(np.full([5], rank + 1, np.float32))

    @tf.function(autograph=False)
    def step(x):
        out = ops.reduce(x, root=root, name="kept_alive")
        if rank == root:
            return out
        ops.keep_alive([out])
        return tf.identity(x)

    want = np.full([5], size * (size + 1) / 2 if rank == root else rank + 1, np.float32)
    for i in range(KEEP_ALIVE_STEPS):
        chk.equal(step(x).numpy(), want, f"keep_alive step {i}")


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    run_collectives(chk, rank, size)
    run_inner_nodes(chk, rank, size)
    check_traffic(chk, rank, size)
    check_bad_root(chk, size)
    check_keep_alive(chk, rank, size)
    ops.barrier(name="end")
    chk.done()


if __name__ == "__main__":
    main()
