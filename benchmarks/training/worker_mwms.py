"""Training-throughput benchmark worker for TF's MultiWorkerMirroredStrategy.

The reference point for benchmarks/training/worker_kungfu.py: the same model, batches,
optimizer, thread settings and timing (the helpers are imported from there),
but trained by a custom ``strategy.run`` loop in a ``tf.function``, with the
model and optimizer built under ``strategy.scope()``. Keras 3's ``model.fit``
does not work with MWMS, hence the custom loop.

Gradients are averaged by the strategy's own all-reduce: under a
tf.distribute strategy, Keras 3's optimizer all-reduce-*sums* the gradients
in ``apply_gradients`` (RING collective over gRPC here), so each replica's
loss is its per-example losses summed over the *global* batch
(``tf.nn.compute_average_loss``), as tf.distribute custom loops do. The
Keras loss is switched to ``reduction="none"`` for that: with its default
reduction it would itself divide by the number of replicas under a strategy,
silently, and a second division would shrink the step by np. One process per worker; the cluster comes from TF_CONFIG, set by
benchmarks/training.py. Rank 0 prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
from typing import Any

import tensorflow as tf

from benchmarks.training.worker_kungfu import (
    load_spec,
    make_batches,
    parse_args,
    report,
    set_threads,
    timed_training,
)


def main() -> None:
    """Builds and times the model on this worker's share of the cluster."""
    args = parse_args(__doc__)
    set_threads(args)  # before the strategy starts the runtime

    import keras

    rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    nworkers = strategy.num_replicas_in_sync

    spec = load_spec(args.model)
    with strategy.scope():
        # Variables created here are mirrored; MWMS initialises every
        # worker's copy from worker 0's value.
        model = spec.build()
        opt = keras.optimizers.SGD(args.lr, momentum=args.momentum)
        opt.build(model.trainable_variables)
    loss_fn = spec.loss()
    loss_fn.reduction = "none"  # per-example; scaled explicitly below
    global_batch = args.batch_size * nworkers
    batches = make_batches(spec, args.batch_size, args.pool, seed=1 + rank)

    def replica_step(x: Any, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            scaled = tf.nn.compute_average_loss(
                per_example, global_batch_size=global_batch
            )
        grads = tape.gradient(scaled, model.trainable_variables)
        # Sums grads over all replicas (strategy all-reduce), then updates.
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return tf.reduce_mean(per_example)  # this worker's batch, unscaled

    # One replica per worker, so strategy.run returns a plain tensor.
    @tf.function
    def step(x: Any, y: tf.Tensor) -> tf.Tensor:
        return strategy.run(replica_step, args=(x, y))

    def replica_sum(t: tf.Tensor) -> tf.Tensor:
        # identity() gives the argument the replica's device (see
        # benchmarks/allreduce/worker_mwms.py).
        return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(t))

    @tf.function
    def tiny_allreduce(t: tf.Tensor) -> tf.Tensor:
        return strategy.run(replica_sum, args=(t,))

    small = tf.zeros([1], tf.float32)

    def barrier() -> None:
        # MWMS has no barrier: no worker can finish an all-reduce alone.
        tiny_allreduce(small).numpy()

    seconds, loss = timed_training(step, batches, args.warmup, args.steps, barrier)
    if rank == 0:
        report("mwms", args, nworkers, seconds, loss, model.count_params())


if __name__ == "__main__":
    main()
