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
    p.add_argument("--repeats", type=int, default=5)
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

    def timed(step: Callable[[], tf.Tensor]) -> Timing:
        return measure(
            step=step,
            materialise=lambda out: out.numpy(),
            barrier=kf.barrier,
            agree_mean=agree_mean,
            repeats=args.repeats,
            target_s=args.target_seconds,
            max_iters=args.max_iters,
        )

    @tf.function
    def nothing(t: tf.Tensor) -> tf.Tensor:
        return tf.identity(t)  # one trivial kernel in place of the all-reduce

    one = tf.ones([1], tf.float32)
    floor = timed(lambda: nothing(one))
    if rank == 0:
        emit_result({"impl": "kungfu_floor", "topology": "-", "np": nworkers, "size": 4}, floor)

    sizes = [int(s) for s in args.sizes.split(",")]
    for topology in args.topologies.split(","):
        # False means the workers disagreed and nothing changed: the points
        # would silently be measured on the previous topology.
        if not bool(kf.set_topology(topology)):
            raise RuntimeError(f"set_topology({topology}) was not applied")
        in_force = topology_in_force(kf)
        for size in sizes:
            x = tf.ones([max(1, size // 4)], tf.float32)
            step = make_step(kf)
            check = step(x).numpy()
            if check[0] != nworkers or check[-1] != nworkers:
                raise RuntimeError(
                    f"{topology} size {size}: wrong all-reduce result "
                    f"{check[0]}/{check[-1]}, expected {nworkers}"
                )
            timing = timed(lambda step=step, x=x: step(x))
            if rank == 0:
                record = {
                    "impl": "kungfu",
                    "topology": topology,
                    "np": nworkers,
                    "size": size,
                    "topology_in_force": in_force,
                }
                emit_result(record, timing)


if __name__ == "__main__":
    main()
