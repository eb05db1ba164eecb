"""StrategyPolicy benchmark worker: a fixed number of training steps, with one strategy or with the policy.

Started by benchmarks/strategy_policy/run.py through ``python -m kungfu_tf.run``
(one launcher per emulated host). Every worker trains the comm-heavy MLP of
models/comm_heavy_mlp.py (``--input-dim`` and ``--hidden`` set the gradient
size; little compute per parameter, so the synchronisation dominates) with
``SynchronousSGDOptimizer(SGD with momentum, strategy=...)`` in a
``kungfu_tf.elastic.function`` loop (traced again after a strategy switch),
driven by a ``PolicyRunner``: with no policy (the strategy stays the one the
job started with) or with ``StrategyPolicy`` over ``--candidates`` (trials:
the policy measures each candidate when a link's rate moves).

After every step rank 0 prints a ``RESULT {json}`` line: the step, its
wall-clock start and end (``time.time()``: the driver throttles the link by
these lines and assigns steps to phases by them), the strategy the step ran
with and the link rates the policy read after it. At the end every rank
prints a summary: the strategy of every step and the policy's decisions as
this rank logged them (the switch times, which are per rank, left out), so
the driver can check that the workers agreed, and what each of its switches
cost here (``SwitchReport``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

from benchmarks.harness.timing import emit_result

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"


def parse_args() -> argparse.Namespace:
    """Command line (every worker of a run gets the same one)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", required=True, help="label of this run in the results")
    p.add_argument("--strategy", required=True, help="the builder the job starts with")
    p.add_argument("--candidates", default="", help="comma-separated builders: run StrategyPolicy over them")
    p.add_argument("--steps", type=int, required=True, help="measured steps")
    p.add_argument("--warmup", type=int, default=4, help="steps before the runner starts")
    p.add_argument("--batch-size", type=int, default=32, help="global batch")
    p.add_argument("--input-dim", type=int, default=512)
    p.add_argument("--hidden", default="1024,1024", help="hidden layer widths")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--link-change", type=float, default=0.5, help="StrategyPolicy(link_change=)")
    p.add_argument("--window", type=int, default=6, help="StrategyPolicy(window=)")
    p.add_argument("--trial-steps", type=int, default=3, help="StrategyPolicy(trial_steps=)")
    p.add_argument("--settle-steps", type=int, default=1, help="StrategyPolicy(settle_steps=)")
    p.add_argument("--min-gain", type=float, default=0.1, help="StrategyPolicy(min_gain=)")
    return p.parse_args()


def agreed_text(line: str) -> str:
    """A decision-log line without what differs between ranks by nature (a switch's own duration).

    Example:
        >>> agreed_text("step 9: strategy PS -> AllReduce in 0.031 s (trial) [StrategyPolicy]")
        'step 9: strategy PS -> AllReduce (trial) [StrategyPolicy]'
    """
    return re.sub(r" in [0-9.]+ s \(", " (", line)


def main() -> None:
    """Builds the model and data, then runs ``--warmup`` + ``--steps`` steps."""
    args = parse_args()
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)

    import keras

    import kungfu_tf
    from kungfu_tf.ops import monitor
    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.policy import PolicyRunner, StrategyPolicy

    sys.path.insert(0, str(MODELS_DIR))
    from comm_heavy_mlp import build_comm_heavy_mlp, synthetic_comm_heavy_data

    rank, size = kungfu_tf.rank(), kungfu_tf.size()
    if args.batch_size % size:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of the {size} workers")
    local = args.batch_size // size
    x, y = synthetic_comm_heavy_data(4 * args.batch_size, input_dim=args.input_dim, seed=0)
    x, y = x[rank::size], y[rank::size]  # this worker's shard
    batches = [(tf.constant(x[i : i + local]), tf.constant(y[i : i + local])) for i in range(0, len(x), local)]
    keras.utils.set_random_seed(0)
    model = build_comm_heavy_mlp(input_dim=args.input_dim, hidden=[int(w) for w in args.hidden.split(",")])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(args.lr, momentum=0.9), strategy=args.strategy)

    @kungfu_tf.elastic.function
    def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    kungfu_tf.broadcast_variables(model.variables, root=0)
    step = 0
    for _ in range(args.warmup):  # tracing, the plan, connections: not measured
        float(train_step(*batches[step % len(batches)]))
        step += 1

    # comm_rates() gives bytes/s since its previous call: without this one, the policy's first reading would
    # span the imports, tracing and warm-up, and its first window (the reference) would look like a slow link.
    monitor.comm_rates()
    policies = []
    if args.candidates:
        candidates = [c.strip() for c in args.candidates.split(",")]
        policies.append(
            StrategyPolicy(opt, candidates, link_change=args.link_change, window=args.window,
                           trial_steps=args.trial_steps, settle_steps=args.settle_steps, min_gain=args.min_gain)
        )  # fmt: skip
    runner = PolicyRunner(policies, batch_size=args.batch_size, verbose=False)
    in_force = []
    with runner.training():
        for i in range(args.steps):
            started = time.time()
            with runner.step():
                loss = float(train_step(*batches[step % len(batches)]))
                strategy = opt._kungfu_plan.strategy.id  # this step's; a switch comes after it
            ended = time.time()
            step += 1
            in_force.append(strategy)
            if rank == 0:
                # link_rates: what the policy's link-rate trigger reads (bytes/s to each peer; only with a policy)
                rates = runner.context.metrics.get("link_rates")
                emit_result({"kind": "step", "run": args.run, "step": i, "start": started, "end": ended,
                             "loss": loss, "strategy": strategy, "link_rates": rates})  # fmt: skip
    switches = [{"old": r.old_id, "new": r.new_id, "agree": r.agree_seconds, "gather": r.gather_seconds,
                 "rebuild": r.rebuild_seconds} for r in (policies[0].reports if policies else [])]  # fmt: skip
    emit_result(
        {"kind": "summary", "run": args.run, "rank": rank, "np": size, "batch_size": args.batch_size,
         "gradient_bytes": 4 * model.count_params(), "strategies": in_force,
         "decisions": [agreed_text(line) for line in runner.log_lines], "switch_seconds": switches}
    )  # fmt: skip


if __name__ == "__main__":
    main()
