"""Cost of calling a tf.function that communicates nothing.

The latency targets compare a 4-byte all-reduce inside a tf.function with a
raw TCP round trip. Calling any tf.function has a fixed cost of its own, so
this measures that floor (same thread settings and timing protocol as the
all-reduce workers) to show how much of the budget dispatch alone uses.

Prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse

import tensorflow as tf

from benchmarks.harness.timing import MAX_ITERS, emit_result, measure


def main() -> None:
    """Times a 4-byte identity tf.function in a single process."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--target-seconds", type=float, default=0.25)
    p.add_argument("--max-iters", type=int, default=MAX_ITERS)
    args = p.parse_args()
    # Same as the workers: one thread each, so the floor is comparable.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    @tf.function
    def step(t: tf.Tensor) -> tf.Tensor:
        # One trivial kernel, standing in for the all-reduce op.
        return tf.identity(t)

    x = tf.ones([1], tf.float32)
    timing = measure(
        step=lambda: step(x),
        materialise=lambda out: out.numpy(),
        barrier=lambda: None,
        agree_mean=lambda v: v,
        repeats=args.repeats,
        target_s=args.target_seconds,
        max_iters=args.max_iters,
    )
    emit_result(
        {"impl": "tf_function_floor", "topology": "-", "np": 1, "size": 4}, timing
    )


if __name__ == "__main__":
    main()
