"""All-reduce benchmark worker for kungfu_tf.

Started once per np by benchmarks/allreduce/run.py through ``kungfu-run``; loops
over topologies and sizes in that one process so TF's import and the
runtime's connection setup are paid once. Every all-reduce is issued from a
``tf.function``, as a training step would, so op dispatch is included.

Rank 0 prints one ``RESULT {json}`` line per (topology, size), and first one
for TF's dispatch floor measured in these same processes (impl
``kungfu_floor``): a tf.function that communicates nothing, timed with the
same protocol. The floor of a lone process (benchmarks/allreduce/dispatch_floor.py)
is not the one these calls pay: with two busy processes on two cores a
thread hand-off costs less than in one process on an otherwise idle machine
(here 77-81 µs against 135-144 µs, 2026-11-27), so the "floor + 20 µs"
target is judged against this one.
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Callable

import tensorflow as tf

from benchmarks.harness.timing import MAX_ITERS, Timing, emit_result, measure


def parse_args() -> argparse.Namespace:
    """Command line of one worker (all workers get the same one)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    p.add_argument(
        "--topologies",
        default="STAR,RING,BINARY_TREE,BINARY_TREE_STAR,CLIQUE,AUTO",
        help="comma-separated topology names",
    )
    p.add_argument(
        "--repeats", type=int, default=5, help="timed loops per point and round"
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="rounds over the topologies, each in a rotated order",
    )
    p.add_argument("--target-seconds", type=float, default=0.3)
    p.add_argument("--max-iters", type=int, default=MAX_ITERS)
    return p.parse_args()


def make_step(kf: types.ModuleType) -> tf.types.experimental.PolymorphicFunction:
    """A fresh tf.function per point, so no trace is shared across sizes."""

    @tf.function
    def step(t: tf.Tensor) -> tf.Tensor:
        return kf.all_reduce(t, op="sum")

    return step


def topology_in_force(kf: types.ModuleType) -> str | None:
    """What the runtime reports after a switch (shows what AUTO resolved to).

    Not part of the minimal API contract, hence optional.
    """
    query = getattr(kf, "topology", None)
    if query is None:
        return None
    value = query()
    return value.numpy().decode() if hasattr(value, "numpy") else str(value)


# AUTO's probe of a size class ends within a few dozen calls of it; more means it failed.
SETTLE_MAX_CALLS = 500


def settle_auto(kf: types.ModuleType, call: Callable[[], tf.Tensor], size: int) -> str:
    """Calls ``call`` until AUTO's choice for ``size`` is agreed on every worker; returns it.

    The issue allows a probe at start (issue 23 §2): AUTO is timed on its
    choice, not on the calls that carried the probe's samples (before,
    they fell into the first timed loops and raised the median: 4 B at
    np=2 took 142, 171 and 137 µs in the first three loops and 96 µs after).
    Agreed with a min over the workers on a fixed topology, so every worker
    makes the same calls. Returns "" if no choice came within
    SETTLE_MAX_CALLS calls (the probe failed; the class is on the size rule).
    """
    for _ in range(SETTLE_MAX_CALLS):
        call().numpy()
        chose = kf.auto_choice(size).numpy().decode()
        everywhere = kf.all_reduce(
            tf.constant([int(bool(chose))], tf.int32), op="min", topology="STAR"
        )
        if int(everywhere.numpy()[0]):
            return chose
    return ""


def main() -> None:
    """Measures every requested (topology, size) point."""
    args = parse_args()
    # Several TF processes share two cores: more threads would only contend.
    # Set before kungfu_tf is imported in case importing it runs ops.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    import kungfu_tf
    from kungfu_tf import ops as kf

    rank, nworkers = kungfu_tf.rank(), kungfu_tf.size()

    def agree_mean(v: float) -> float:
        total = kf.all_reduce(tf.constant([v], tf.float32), op="sum")
        return float(total.numpy()[0]) / nworkers

    def timed(step: Callable[[], tf.Tensor], repeats: int = args.repeats) -> Timing:
        return measure(
            step=step,
            materialise=lambda out: out.numpy(),
            barrier=kf.barrier,
            agree_mean=agree_mean,
            repeats=repeats,
            target_s=args.target_seconds,
            max_iters=args.max_iters,
        )

    @tf.function
    def nothing(t: tf.Tensor) -> tf.Tensor:
        return tf.identity(t)  # one trivial kernel in place of the all-reduce

    one = tf.ones([1], tf.float32)
    # As many loops as a point gets over all its rounds (--repeats is per round).
    floor = timed(lambda: nothing(one), repeats=args.repeats * args.rounds)
    if rank == 0:
        emit_result({"impl": "kungfu_floor", "topology": "-", "np": nworkers, "size": 4}, floor)

    sizes = [int(s) for s in args.sizes.split(",")]
    topologies = args.topologies.split(",")
    # Per size, the topologies are measured in args.rounds rounds, each in a
    # rotated order, and a point's median is over all its rounds' loops: a
    # fixed topology measured twice in one process differed by 1.6x (CLIQUE,
    # 1 MiB, np=2: 264 and 429 µs), far more than AUTO's 5 % target, and
    # the drift of the machine's speed then falls on every column alike.
    for size in sizes:
        x = tf.ones([max(1, size // 4)], tf.float32)
        steps = {t: make_step(kf) for t in topologies}
        timings: dict[str, list[Timing]] = {t: [] for t in topologies}
        in_force: dict[str, str | None] = {}
        chose = ""
        for r in range(args.rounds):
            for topology in (
                topologies[r % len(topologies) :] + topologies[: r % len(topologies)]
            ):
                # False means the workers disagreed and nothing changed: the points
                # would silently be measured on the previous topology.
                if not bool(kf.set_topology(topology)):
                    raise RuntimeError(f"set_topology({topology}) was not applied")
                in_force[topology] = topology_in_force(kf)
                step = steps[topology]
                if r == 0:
                    check = step(x).numpy()
                    if check[0] != nworkers or check[-1] != nworkers:
                        raise RuntimeError(
                            f"{topology} size {size}: wrong all-reduce result "
                            f"{check[0]}/{check[-1]}, expected {nworkers}"
                        )
                if topology == "AUTO":
                    chose = settle_auto(kf, lambda step=step, x=x: step(x), size)
                timings[topology].append(timed(lambda step=step, x=x: step(x)))
        if rank == 0:
            for topology in topologies:
                record = {
                    "impl": "kungfu",
                    "topology": topology,
                    "np": nworkers,
                    "size": size,
                    "topology_in_force": in_force[topology],
                    "rounds": args.rounds,
                }
                if topology == "AUTO" and chose:
                    record["auto_choice"] = chose
                runs = timings[topology]
                emit_result(
                    record,
                    Timing(
                        iters=runs[0].iters,  # the first round's: each round agrees its own count
                        samples_s=[t for run in runs for t in run.samples_s],
                    ),
                )


if __name__ == "__main__":
    main()
