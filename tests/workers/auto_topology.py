"""Worker for tests/test_auto_topology.py: AUTO's measured choice, end to end.

Usage: auto_topology.py

One tf.function all-reduces (AUTO, the launcher's default topology) a
tensor of every size in SIZES — on both sides of several size-class
boundaries, from 4 B to 4 MiB — all at once, so each worker's executor
issues them in its own order and the first ones start AUTO's probes
concurrently. The step runs three times (probing, then on the decided
topologies). Inputs are small integers, so the sums are exact in any order:
every result must equal numpy's bit for bit. A worker that picked another
topology than its peers for a size class would fail the step with
FailedPreconditionError naming both topologies. Then ops.auto_probe_samples()
must grow (KUNGFU_AUTO_PROBES=0: stay 0) and stop growing once every class
has decided. Ends with "checked N results".
"""

from __future__ import annotations

import os

import _setup
from _setup import Checker, make_input, ops, reduce_ref, tf

# (elements, dtype): float32 counts straddle the classes of 4 B, 1 KiB,
# 64 KiB, 1 MiB and 4 MiB; one int32 and one float64 tensor share classes
# with float32 ones.
SIZES = (
    (1, "float32"),
    (2, "float32"),
    (256, "float32"),
    (257, "float32"),
    (16384, "float32"),
    (16385, "float32"),
    (262144, "float32"),
    (262145, "float32"),
    (1048577, "float32"),
    (300, "int32"),
    (128, "float64"),
)
STEPS = 3
QUIET, MAX_STEPS = 3, 300


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    chk.equal(ops.topology().numpy().decode(), "AUTO", "the launcher's default topology")
    inputs, wants = [], []
    for i, (n, dt) in enumerate(SIZES):
        xs = [make_input(f"auto/{i}", r, (n,), dt, "small") for r in range(size)]
        inputs.append(tf.constant(xs[rank]))
        wants.append(reduce_ref(xs, "sum", dt))

    @tf.function(autograph=False)
    def step(xs):
        return [ops.all_reduce(x, op="sum") for x in xs]

    for s in range(STEPS):
        for (n, dt), got, want in zip(SIZES, step(inputs), wants):
            chk.equal(got.numpy(), want, f"step {s}: {n} x {dt}")
    # ops.auto_probe_samples(): grows while the classes are measured (one sample after each call of a
    # class) and stops once every class has decided, which a finite number of calls brings about. Run
    # until it has not moved on any worker for QUIET steps in a row (or MAX_STEPS, which a probe that
    # never ends hits). Agreed (max on a fixed topology, which AUTO does not probe): a worker that
    # stopped on its own count would leave its peers in a step's all-reduces (failed CI at 6fa8271).
    seen, quiet, steps = int(ops.auto_probe_samples()), 0, 0
    while quiet < QUIET and steps < MAX_STEPS:
        step(inputs)
        steps += 1
        now = int(ops.auto_probe_samples())
        moved = ops.all_reduce(tf.constant([int(now != seen)], tf.int32), op="max", topology="STAR")
        quiet = quiet + 1 if int(moved.numpy()[0]) == 0 else 0
        seen = now
    chk.true(quiet == QUIET, f"the probe samples stopped growing within {MAX_STEPS} steps (ran {steps})")
    probing = os.environ.get("KUNGFU_AUTO_PROBES") != "0"
    if probing:
        chk.true(seen > 0, f"probe samples started (got {seen})")
    else:
        chk.equal(seen, 0, "probe samples with KUNGFU_AUTO_PROBES=0")
    # ops.auto_choice: each class's agreed topology, the same name on every worker (min == max of its
    # index, on a fixed topology); with probing off no class was measured, and the name stays empty.
    # The last sample's start stops the count above, the agreement on the choice follows it in the
    # background: step on (agreed, as above) until every worker holds every class's choice.
    names = ("", "STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")
    sizes_bytes = [n * tf.dtypes.as_dtype(dt).size for n, dt in SIZES]
    for _ in range(MAX_STEPS if probing else 0):
        mine = int(all(ops.auto_choice(b).numpy() for b in sizes_bytes))
        if int(ops.all_reduce(tf.constant([mine], tf.int32), op="min", topology="STAR").numpy()[0]):
            break
        step(inputs)
    for nbytes in sizes_bytes:
        name = ops.auto_choice(nbytes).numpy().decode()
        index = tf.constant([names.index(name) if name in names else -1], tf.int32)
        low = int(ops.all_reduce(index, op="min", topology="STAR").numpy()[0])
        high = int(ops.all_reduce(index, op="max", topology="STAR").numpy()[0])
        if probing:
            chk.true(name in names[1:] and low == high, f"auto_choice({nbytes}) = {name!r}, agreed ({low}, {high})")
        else:
            chk.equal(name, "", f"auto_choice({nbytes}) with KUNGFU_AUTO_PROBES=0")
    for bad, cause in ((-1, "bytes must be >= 0"), ([4, 8], "bytes must be a scalar")):
        try:
            ops.auto_choice(bad)
            chk.true(False, f"auto_choice({bad}) raised nothing")
        except tf.errors.InvalidArgumentError as e:
            chk.true(cause in str(e), f"auto_choice({bad}) names the cause: {e}")
    chk.done()


if __name__ == "__main__":
    main()
