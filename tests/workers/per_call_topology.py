"""Worker for tests/test_per_call_topology.py: all-reduces pinned to a topology.

Usage: per_call_topology.py

One tf.function holds, for every topology name (and None: the runtime's
current one), an all_reduce of float32 (sum, 300001 elements: several 1 MiB
chunks), of int32 (max), of float64 (mean), and a group_all_reduce of mixed
dtypes; all of them run concurrently in one step. The step runs twice, with
the runtime's topology switched in between (STAR, then RING), which the
pinned calls must ignore and the unpinned ones follow. The same calls run
eagerly once. Then:

* an unknown topology raises ValueError (Python, listing the valid names)
  and InvalidArgumentError (the kernel's own check, reached through the raw
  op);
* workers that pin different topologies for one collective (rank 0 STAR,
  the others RING) fail fast with FailedPreconditionError naming both; the
  job stays usable.

Every result is compared with numpy. Ends with "checked N results" (see
expected_checks() in the test).
"""

from __future__ import annotations

import time

import _setup
from _setup import TOPOLOGIES, Checker, make_input, ops, reduce_ref, tf, tolerance

from kungfu_tf._native import library

CHOICES = (*TOPOLOGIES, None)
# (elements, dtype, op, input kind) of the single all-reduces per topology.
SINGLES = ((300001, "float32", "sum", "small"), (1001, "int32", "max", "big"), (77, "float64", "mean", "real"))
# Members of the group per topology (mixed dtypes: one fused collective each).
GROUP = ((5, "float32"), (1, "int64"), (4096, "float32"), (3, "int32"))


def label(topo: str | None) -> str:
    return topo or "current"


def make_case(tag: str, rank: int, size: int):
    """This rank's inputs and the expected outputs for every topology choice."""
    inputs, wants = [], []
    for topo in CHOICES:
        mine, want = [], []
        for i, (n, dt, op, kind) in enumerate(SINGLES):
            xs = [make_input(f"{tag}/{label(topo)}/single{i}", r, (n,), dt, kind) for r in range(size)]
            mine.append(xs[rank])
            want.append((reduce_ref(xs, op, dt), tolerance(dt, size) if op == "mean" else None))
        for i, (n, dt) in enumerate(GROUP):
            xs = [make_input(f"{tag}/{label(topo)}/group{i}", r, (n,), dt, "small") for r in range(size)]
            mine.append(xs[rank])
            want.append((reduce_ref(xs, "sum", dt), None))
        inputs.append(mine)
        wants.append(want)
    return inputs, wants


def issue(inputs):
    """Every topology choice's collectives; outputs in the order of make_case."""
    outs = []
    for topo, xs in zip(CHOICES, inputs):
        got = [ops.all_reduce(x, op=op, topology=topo) for x, (_, _, op, _) in zip(xs, SINGLES)]
        got += ops.group_all_reduce(xs[len(SINGLES):], op="sum", topology=topo)
        outs.append(got)
    return outs


@tf.function(autograph=False)
def step(inputs):
    return issue(inputs), ops.topology()


def check(chk: Checker, outs, wants, where: str) -> None:
    for topo, got, want in zip(CHOICES, outs, wants):
        for i, (g, (w, atol)) in enumerate(zip(got, want)):
            what = f"{where} topology={label(topo)} output {i}"
            g = g.numpy()
            if atol is None:
                chk.equal(g, w, what)
            else:
                chk.close(g, w, atol, what)


def check_errors(chk: Checker, rank: int, size: int) -> None:
    try:
        ops.all_reduce(tf.ones([2]), topology="HYPERCUBE")
    except ValueError as e:
        chk.true("HYPERCUBE" in str(e) and "BINARY_TREE_STAR" in str(e), f"ValueError text: {e}")
    else:
        chk.fail("all_reduce(topology='HYPERCUBE') did not raise ValueError")
    try:
        ops.group_all_reduce([tf.ones([2])], topology="ring2")
    except ValueError as e:
        chk.true("ring2" in str(e) and "CLIQUE" in str(e), f"ValueError text: {e}")
    else:
        chk.fail("group_all_reduce(topology='ring2') did not raise ValueError")
    try:
        library().kungfu_all_reduce(tf.ones([2]), tf.constant("raw"), topology="HYPERCUBE")
    except tf.errors.InvalidArgumentError as e:
        chk.true("HYPERCUBE" in e.message and "STAR" in e.message, f"kernel error text: {e.message}")
    else:
        chk.fail("KungfuAllReduce(topology='HYPERCUBE') did not fail")

    # Rank 0 pins STAR, the others RING, for the same collective.
    t = time.monotonic()
    try:
        ops.all_reduce(tf.ones([1000]), name="disagree", topology="STAR" if rank == 0 else "RING")
    except tf.errors.FailedPreconditionError as e:
        elapsed = time.monotonic() - t
        message = " ".join(e.message.split())
        print(f"disagree after {elapsed:.3f}s: {message}", flush=True)
        for needle in ("'disagree'", "STAR", "RING"):
            chk.true(needle in message, f"{needle} not in: {message}")
        # Reported as the disagreement it is, not timed out: a timeout raises
        # DeadlineExceededError, never FailedPreconditionError naming both
        # topologies (a clock bound here raced three workers on two cores).
    except tf.errors.OpError as e:
        chk.fail(f"disagree: expected FailedPreconditionError, got {type(e).__name__}: {e.message}")
    else:
        chk.fail("all-reduce with different topologies on different workers succeeded")
    xs = [make_input("after", r, (1001,), "int64", "real") for r in range(size)]
    got = ops.all_reduce(tf.constant(xs[rank]), name="after", topology="CLIQUE").numpy()
    chk.equal(got, reduce_ref(xs, "sum", "int64"), "all_reduce after the disagreement")


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    for i, current in enumerate(("STAR", "RING")):
        chk.true(bool(ops.set_topology(current).numpy()), f"set_topology({current})")
        inputs, wants = make_case(f"function/{i}", rank, size)
        outs, topo = step([[tf.constant(x) for x in xs] for xs in inputs])
        chk.equal(topo.numpy().decode(), current, "topology() inside the step")
        check(chk, outs, wants, f"function/{current}")
    inputs, wants = make_case("eager", rank, size)
    check(chk, issue([[tf.constant(x) for x in xs] for xs in inputs]), wants, "eager")
    check_errors(chk, rank, size)
    ops.barrier(name="end")
    chk.done()


if __name__ == "__main__":
    main()
