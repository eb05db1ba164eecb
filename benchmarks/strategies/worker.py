"""Strategy benchmark worker: every builder's per-iteration time on one model.

Started by benchmarks/strategies/run.py through ``python -m kungfu_tf.run``
(one launcher per emulated host). Every worker builds the model once, takes
rank 0's initial weights, then for each builder makes its own
``SynchronousSGDOptimizer(SGD, strategy=NAME)`` (the builder's default
settings, on the cluster of the running job: ranks and their hosts from
``kungfu-run``'s peer list) and its own ``tf.function`` step. The name
``default`` stands for no strategy at all (today's plain S-SGD); ``Auto``
for ``builders.Auto``: its searches run first, on the same model and batches
(benchmarks/strategies/auto_searches.py), and its best strategy is then timed
beside the builders.

Builders are timed in rounds, the order rotating every round, so slow drift
of the machine does not favour the builder that happens to run first. Each
timed block is: a barrier, ``--steps`` steps, the last loss copied to the
host. Around each block every rank also reads the runtime's byte counters,
split by whether the receiving peer is on the same host or another one, and
the ranks sum them, so the report can say how much each builder moved over
the (emulated, rate-limited) inter-host link. Rank 0 prints one
``RESULT {json}`` line per builder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from benchmarks.harness.timing import emit_result
from benchmarks.strategies.auto_searches import AUTO, run_searches

# The pseudo-builder for SynchronousSGDOptimizer without a strategy: what a
# user gets by default (fused all-reduce buckets), the baseline of the table.
DEFAULT = "default"


def parse_args() -> argparse.Namespace:
    """Command line (every worker of a run gets the same one)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True, help="a name from models/registry.py")
    p.add_argument(
        "--builders",
        required=True,
        help=f"comma-separated builder names; {DEFAULT!r} = no strategy (plain S-SGD)",
    )
    p.add_argument("--setting", required=True, help="label of the cluster setting")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per builder")
    p.add_argument("--steps", type=int, default=3, help="timed steps per block")
    p.add_argument("--rounds", type=int, default=2, help="timed blocks per builder")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--pool", type=int, default=4, help="distinct batches per worker")
    p.add_argument("--auto-budget", type=int, default=8, help="trials of each Auto search")
    p.add_argument("--auto-trials-per-round", type=int, default=4, help="trials between ranker refits")
    p.add_argument("--auto-seed", type=int, default=0, help="the Auto sampler's seed")
    p.add_argument("--intra-op", type=int, default=1)
    p.add_argument("--inter-op", type=int, default=2)
    return p.parse_args()


def host_of_each_rank() -> list[str]:
    """The host part of every peer in ``kungfu-run``'s peer list."""
    return [p.rsplit(":", 1)[0] for p in os.environ["KUNGFU_PEERS"].split(",")]


def main() -> None:
    """Builds the model, then traces and times one step function per builder."""
    args = parse_args()
    # Imported here, so the driver can import DEFAULT without loading TF.
    import tensorflow as tf

    from benchmarks.training.worker_kungfu import load_spec, make_batches

    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op)
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op)
    # One step function per builder is by design, not accidental retracing.
    tf.get_logger().setLevel("ERROR")

    import keras

    import kungfu_tf
    from kungfu_tf import ops as kf
    from kungfu_tf.optimizers import SynchronousSGDOptimizer

    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    hosts = host_of_each_rank()
    other_host = tf.constant([h != hosts[rank] for h in hosts])
    spec = load_spec(args.model)
    model = spec.build()
    loss_fn = spec.loss()
    kungfu_tf.broadcast_variables(model.variables, root=0)
    batches = make_batches(spec, args.batch_size, args.pool, seed=1 + rank)
    names = [b.strip() for b in args.builders.split(",")]

    def make_step(builder: str) -> tuple[Any, Any]:
        opt = SynchronousSGDOptimizer(
            keras.optimizers.SGD(args.lr, momentum=args.momentum),
            strategy=None if builder == DEFAULT else builder,
        )

        @tf.function
        def step(x: Any, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return opt, step

    def sent_bytes() -> tf.Tensor:
        """This rank's bytes sent so far: [to any peer, to peers on other hosts]."""
        sent, _ = kf.comm_bytes()
        cross = tf.reduce_sum(tf.where(other_host, sent, tf.zeros_like(sent)))
        return tf.stack([tf.reduce_sum(sent), cross])

    def timed_block(step: Any) -> tuple[float, float, tf.Tensor]:
        """(seconds, last loss, bytes sent) of ``args.steps`` steps after a barrier."""
        kf.barrier()
        before = sent_bytes()
        t0 = time.perf_counter()
        for i in range(args.steps):
            loss = step(*batches[i % len(batches)])
        last = float(loss)
        return time.perf_counter() - t0, last, sent_bytes() - before

    steps: dict[str, Any] = {}
    auto_info: dict[str, Any] = {}
    if AUTO in names:
        # First: every switch of a search makes the steps traced before it stale.
        steps[AUTO], auto_info = run_searches(model, loss_fn, batches, args)
    for name in names:
        if name != AUTO:
            _, steps[name] = make_step(name)
        # Trace, build the optimizer, open the connections the strategy uses.
        for i in range(max(1, args.warmup)):
            float(steps[name](*batches[i % len(batches)]))

    seconds: dict[str, list[float]] = {n: [] for n in names}
    moved: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            s, losses[name], sent = timed_block(steps[name])
            # Summed over ranks: what the whole job moved per step.
            total, cross = (
                float(v) / args.steps
                for v in kf.all_reduce(tf.cast(sent, tf.float64)).numpy()
            )
            seconds[name].append(s / args.steps)
            moved[name].append((total, cross))

    if rank != 0:
        return
    for name in names:
        extra = {"auto": auto_info} if name == AUTO else {}
        emit_result(
            {
                **extra,
                "model": args.model,
                "builder": name,
                "setting": args.setting,
                "np": size,
                "hosts": len(set(hosts)),
                "batch_size": args.batch_size,
                "steps": args.steps,
                "rounds": args.rounds,
                "step_s": statistics.median(seconds[name]),
                "step_s_all": seconds[name],
                "bytes_per_step": statistics.median(t for t, _ in moved[name]),
                "cross_host_bytes_per_step": statistics.median(
                    c for _, c in moved[name]
                ),
                "final_loss": losses[name],
                "params": model.count_params(),
            }
        )


if __name__ == "__main__":
    main()
