"""The workers of ``kungfu-strategy search``: a strategy search on a model of the registry.

    kungfu-run -np 4 python models/search_strategy.py --model ncf --budget 8 --output best.pbtxt

Every worker builds the model, wraps SGD in
``SynchronousSGDOptimizer(strategy=builders.Auto(...))`` and trains on
synthetic data (its own shard of each global batch, seeded by rank) until
the search has spent its budget; the trials are these training steps
(kungfu_tf/strategy/auto/builder.py). Rank 0 writes the best strategy to
``--output`` (protobuf text, or JSON for a ``.json`` name) and, with
``--log``, one JSON line per trial.
"""

from __future__ import annotations

import argparse
import os
import sys

import keras
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from registry import MODELS

import kungfu_tf
from kungfu_tf.elastic import function as step_function
from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders
from kungfu_tf.strategy import format as strategy_format
from kungfu_tf.strategy.auto.search import check_searchable
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.variable_info import describe_model

# Distinct batches each worker cycles through (generated once: data is not what is measured).
BATCHES = 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, choices=sorted(MODELS))
    p.add_argument("--budget", type=int, default=8, help="trials")
    p.add_argument("--seconds", type=float, help="seconds of trials (with or instead of --budget)")
    p.add_argument("--trial-steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--confirm-top", type=int, default=2, help="the fastest strategies tried once more")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hosts", type=int, default=1, help="hosts the cost model ranks candidates for")
    p.add_argument("--bandwidth-gbps", type=float, help="declared bandwidth between those hosts")
    p.add_argument("--output", required=True)
    p.add_argument("--log", help="JSON lines search log (rank 0)")
    p.add_argument("--threads", type=int, default=1, help="TF intra-op threads")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    spec = MODELS[args.model]
    keras.backend.clear_session()  # the variable names kungfu-strategy explain --model sees
    model = spec.build()
    check_searchable(describe_model(model), size)  # a precise error on every worker, before any collective
    view = None
    if args.hosts > 1 or args.bandwidth_gbps is not None:
        view = ClusterSpec.uniform(size, args.hosts, args.bandwidth_gbps)
    auto = builders.Auto(
        budget=args.budget,
        seconds=args.seconds,
        trial_steps=args.trial_steps,
        warmup=args.warmup,
        confirm_top=args.confirm_top,
        seed=args.seed,
        log_path=args.log,
        cluster=view,
    )
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr), strategy=auto)
    loss_fn = spec.loss()
    kungfu_tf.broadcast_variables(model.variables, root=0, name="search/init/weights")  # one model, as in training

    @step_function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    batches = []
    for b in range(BATCHES):
        x, y = spec.data(args.batch_size, args.seed + 1000 * (b * size + rank) + 1)
        batches.append((x, y))
    step = 0
    # The search ends on the step after its last trial (it switches to the best there).
    while auto.result is None:
        x, y = batches[step % BATCHES]
        train_step(x, y)
        step += 1
    if rank == 0:
        strategy_format.save(auto.result.best, args.output)
        print(
            f"best strategy {auto.result.best.id!r}: {auto.result.best_seconds * 1e3:.1f} ms/step over "
            f"{len(auto.result.records)} trials ({auto.result.search_seconds:.1f} s); wrote {args.output}",
            flush=True,
        )


if __name__ == "__main__":
    main()
