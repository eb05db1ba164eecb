"""All-reduce benchmark worker for TensorFlow's MultiWorkerMirroredStrategy.

The reference point for kungfu_tf: TF's own collective all-reduce (RING
implementation, gRPC transport). One process per worker; the cluster comes
from the TF_CONFIG environment variable set by benchmarks/allreduce.py.

Rank 0 prints one ``RESULT {json}`` line per measured size.
"""

from __future__ import annotations

import argparse
import json
import os

import tensorflow as tf

from benchmarks.harness.timing import MAX_ITERS, emit_result, measure


def parse_args() -> argparse.Namespace:
    """Command line of one worker (all workers get the same one)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", required=True, help="comma-separated sizes in bytes")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--target-seconds", type=float, default=0.3)
    p.add_argument("--max-iters", type=int, default=MAX_ITERS)
    return p.parse_args()


def main() -> None:
    """Measures every requested size on this worker's share of the cluster."""
    args = parse_args()
    # Several TF processes share two cores: more threads would only contend.
    # Must happen before the strategy starts the runtime.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    rank = int(task["index"])
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    nworkers = strategy.num_replicas_in_sync

    def replica_fn(t: tf.Tensor) -> tf.Tensor:
        # A function argument has no device inside the graph, and MWMS
        # derives the reduce destination from it; identity() picks up the
        # replica's device scope (same device, so no copy is made).
        return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(t))

    # One replica per worker, so strategy.run returns a plain tensor. The
    # whole strategy.run sits in a tf.function: that is how MWMS is meant to
    # be used, and eager strategy.run would re-trace on every call.
    @tf.function
    def allreduce(t: tf.Tensor) -> tf.Tensor:
        return strategy.run(replica_fn, args=(t,))

    small = tf.zeros([1], tf.float32)

    def barrier() -> None:
        # No process group barrier in MWMS: a 1-element all-reduce cannot
        # finish on any worker before every worker has joined it.
        allreduce(small).numpy()

    def agree_mean(v: float) -> float:
        return float(allreduce(tf.constant([v], tf.float32)).numpy()[0]) / nworkers

    for size in (int(s) for s in args.sizes.split(",")):
        x = tf.ones([max(1, size // 4)], tf.float32)
        check = allreduce(x).numpy()
        if check[0] != nworkers or check[-1] != nworkers:
            raise RuntimeError(f"wrong all-reduce result {check[0]} != {nworkers}")
        timing = measure(
            step=lambda x=x: allreduce(x),
            materialise=lambda out: out.numpy(),
            barrier=barrier,
            agree_mean=agree_mean,
            repeats=args.repeats,
            target_s=args.target_seconds,
            max_iters=args.max_iters,
        )
        if rank == 0:
            record = {"impl": "mwms", "topology": "RING", "np": nworkers, "size": size}
            emit_result(record, timing)


if __name__ == "__main__":
    main()
