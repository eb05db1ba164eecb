"""Monitoring-overhead benchmark worker: one model, four monitoring settings, rotating order.

Started by benchmarks/monitoring_overhead/run.py through ``python -m kungfu_tf.run
-np N``. Every worker builds the model once and, per setting, an S-SGD
optimizer with its own monitor (or none) and its own traced ``tf.function``
step on that model:

    none           SynchronousSGDOptimizer without a monitor
    gns@1          GradientMonitor(gns=True)  (GNS + compute times every step)
    variance@1     GradientMonitor(gns=False, variance_interval=1)
    variance@8     GradientMonitor(gns=False, variance_interval=8)

After a warm-up of every step function, ``--rounds`` rounds each time
``--steps`` steps of every setting; round k starts with setting k mod 4 and
goes on in order, so slow phases of a shared machine do not fall on one
setting. Rank 0 prints one ``RESULT {json}`` line with every setting's
wall seconds per round (rank 0) and CPU seconds per round (process time,
summed over all workers).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import tensorflow as tf

from benchmarks.harness.timing import emit_result
from benchmarks.training.worker_kungfu import load_spec, make_batches

SETTINGS = ("none", "gns@1", "variance@1", "variance@8")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch")
    p.add_argument("--steps", type=int, default=8, help="timed steps per setting and round (a multiple of 8)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--inter-op", type=int, default=2)
    return p.parse_args()


def make_monitor(setting: str, batch_size: int) -> Any:
    from kungfu_tf.optimizers import GradientMonitor

    if setting == "none":
        return None
    if setting == "gns@1":
        return GradientMonitor(batch_size=batch_size, gns=True)
    interval = int(setting.split("@")[1])
    return GradientMonitor(batch_size=batch_size, gns=False, variance_interval=interval)


def main() -> None:
    args = parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)

    import keras

    import kungfu_tf
    from kungfu_tf import ops as kf
    from kungfu_tf.optimizers import SynchronousSGDOptimizer

    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    spec = load_spec(args.model)
    model = spec.build()
    loss_fn = spec.loss()
    batches = make_batches(spec, args.batch_size, 4, seed=1 + rank)
    model(batches[0][0])  # build the weights
    kungfu_tf.broadcast_variables(model.variables, root=0)

    def make_step(setting: str) -> Any:
        opt = SynchronousSGDOptimizer(
            keras.optimizers.SGD(0.001, momentum=0.9),
            monitor=make_monitor(setting, args.batch_size),
            name=f"bench_{setting.replace('@', '_')}",
        )

        @tf.function
        def step(x: Any, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return step, opt

    steps = {s: make_step(s) for s in SETTINGS}
    for setting, (step, _) in steps.items():
        for i in range(args.warmup):
            float(step(*batches[i % len(batches)]))
    seconds: dict[str, list[float]] = {s: [] for s in SETTINGS}
    cpu_seconds: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for r in range(args.rounds):
        order = SETTINGS[r % len(SETTINGS):] + SETTINGS[: r % len(SETTINGS)]
        for setting in order:
            step, _ = steps[setting]
            kf.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(args.steps):
                loss = step(*batches[i % len(batches)])
            float(loss)
            seconds[setting].append(time.perf_counter() - t0)
            cpu_seconds[setting].append(time.process_time() - c0)
    # CPU time of all workers: on a shared machine the wall time of a round
    # varies with other users' load, the CPU a step costs much less so.
    cpu_total = kf.all_reduce(tf.constant([cpu_seconds[s] for s in SETTINGS], tf.float64), op="sum").numpy()
    monitored = {s: opt.kungfu_monitor.values() for s, (_, opt) in steps.items() if opt.kungfu_monitor is not None}
    if rank == 0:
        emit_result(
            {
                "impl": "monitoring",
                "model": args.model,
                "np": size,
                "batch_size": args.batch_size,
                "steps": args.steps,
                "rounds": args.rounds,
                "seconds": seconds,
                "cpu_seconds": {s: cpu_total[i].tolist() for i, s in enumerate(SETTINGS)},
                "gns": monitored["gns@1"]["gns"],
                "variance": monitored["variance@8"]["grad_variance"],
                "worker_compute_times": monitored["gns@1"]["worker_compute_times"],
            }
        )


if __name__ == "__main__":
    main()
