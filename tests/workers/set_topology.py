"""Worker for tests/test_set_topology.py: switching topologies between steps.

Usage: set_topology.py

STEPS steps; each runs a tf.function with 20 concurrent all-reduces (sizes 1
to 300001 elements, several over the 1 MiB chunk size, float32 sum and int32
sum/max) on new data, and returns topology(). Every SWITCH_EVERY steps all
workers switch to the next topology of SEQUENCE: alternately eagerly, and
inside a tf.function that runs set_topology and then, under a control
dependency, the step's all-reduces.

Then disagreements: workers ask for different topologies (eagerly, and
inside the tf.function), which must return False everywhere and keep the old
topology; and names differing only in case, which must agree.

Ends with "checked N results" (see expected_checks() in the test).
"""

from __future__ import annotations

import time

import _setup
from _setup import Checker, make_input, ops, reduce_ref, tf

SEQUENCE = ("RING", "BINARY_TREE", "STAR", "CLIQUE", "BINARY_TREE_STAR", "AUTO")
STEPS = 18
SWITCH_EVERY = 3
SIZES = (1, 3, 64, 1001, 4096, 16385, 65536, 100000, 262144, 300001)
SPECS = [(n, "float32", "sum") for n in SIZES] + [(n, "int32", "max" if i % 2 else "sum") for i, n in enumerate(SIZES)]


def step_data(tag: str, rank: int, size: int):
    """This rank's inputs and the expected outputs of one step."""
    mine, want = [], []
    for i, (n, dt, op) in enumerate(SPECS):
        xs = [make_input(f"{tag}/{i}", r, (n,), dt, "small" if op == "sum" else "big") for r in range(size)]
        mine.append(tf.constant(xs[rank]))
        want.append(reduce_ref(xs, op, dt))
    return mine, want


def reduce_all(xs):
    return [ops.all_reduce(x, op=op) for x, (_, _, op) in zip(xs, SPECS)]


@tf.function
def step(xs):
    return reduce_all(xs), ops.topology()


@tf.function
def switch_and_step(name, xs):
    changed = ops.set_topology(name)
    with tf.control_dependencies([changed]):
        outs = reduce_all([tf.identity(x) for x in xs])
        return changed, outs, ops.topology()


def check_step(chk: Checker, outs, current, want, topo: str, what: str) -> None:
    for i, (got, w) in enumerate(zip(outs, want)):
        chk.equal(got.numpy(), w, f"{what}: all_reduce {i} {SPECS[i]} on {topo}")
    chk.equal(current.numpy().decode(), topo, f"{what}: topology() inside tf.function")


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    topo = ops.topology().numpy().decode()
    chk.equal(topo, "AUTO", "initial topology")
    switches = 0
    t0 = time.monotonic()
    for s in range(STEPS):
        xs, want = step_data(f"step{s}", rank, size)
        if s % SWITCH_EVERY == 0:
            topo = SEQUENCE[switches % len(SEQUENCE)]
            if switches % 2 == 0:
                chk.true(bool(ops.set_topology(topo).numpy()), f"step {s}: set_topology({topo}) returned False")
                outs, current = step(xs)
            else:
                changed, outs, current = switch_and_step(tf.constant(topo), xs)
                chk.true(bool(changed.numpy()), f"step {s}: set_topology({topo}) in tf.function returned False")
            chk.equal(ops.topology().numpy().decode(), topo, f"step {s}: topology() after switching")
            switches += 1
        else:
            outs, current = step(xs)
        check_step(chk, outs, current, want, topo, f"step {s}")
    print(f"{STEPS} steps, {switches} switches in {time.monotonic() - t0:.1f}s", flush=True)

    # Everyone disagrees with rank 0: nothing changes.
    assert topo == "AUTO"
    ask = "RING" if rank == 0 else "STAR"
    chk.true(not bool(ops.set_topology(ask).numpy()), f"disagreement ({ask}) returned True")
    chk.equal(ops.topology().numpy().decode(), "AUTO", "topology after a disagreement")
    xs, want = step_data("disagree1", rank, size)
    outs, current = step(xs)
    check_step(chk, outs, current, want, "AUTO", "after a disagreement")

    # The same topology spelled differently is an agreement.
    ask = "clique" if rank % 2 else "CLIQUE"
    chk.true(bool(ops.set_topology(ask).numpy()), f"set_topology({ask}) returned False")
    chk.equal(ops.topology().numpy().decode(), "CLIQUE", "topology after mixed-case agreement")
    xs, want = step_data("mixed_case", rank, size)
    outs, current = step(xs)
    check_step(chk, outs, current, want, "CLIQUE", "after mixed-case agreement")

    # Only the last worker disagrees, inside the tf.function.
    ask = "BINARY_TREE" if rank == size - 1 else "RING"
    xs, want = step_data("disagree2", rank, size)
    changed, outs, current = switch_and_step(tf.constant(ask), xs)
    chk.true(not bool(changed.numpy()), "disagreement in tf.function returned True")
    check_step(chk, outs, current, want, "CLIQUE", "after a disagreement in tf.function")
    chk.equal(ops.topology().numpy().decode(), "CLIQUE", "topology after a disagreement in tf.function")
    if step.experimental_get_tracing_count() != 1 or switch_and_step.experimental_get_tracing_count() != 1:
        chk.fail("a step function was retraced")
    chk.done()


if __name__ == "__main__":
    main()
