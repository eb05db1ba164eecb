"""The Auto column of the strategy benchmark: two searches on the workers, then Auto's step.

Run by benchmarks/strategies/worker.py before the hand builders' steps are
traced (a switch of strategy makes every step traced before it stale, see
kungfu_tf/strategy/plan_generation.py). Each search trains the benchmark's
own model on its own batches through ``builders.Auto``:

* ``ranker``: the full search (sampler, calibrated cost model, ranker
  refined by the trials) — its best strategy is the Auto column;
* ``cost-model``: the same search with the ranker off (the cost model's
  prediction decides every round), for the comparison AutoDist's Fig. 4
  and Fig. 9 make.

Each returns its trial records (predicted by the search model at selection,
predicted by the cost model alone, measured), the agreed search time, and
the best strategy.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

AUTO = "Auto"
SEARCH_MODES = ("ranker", "cost-model")


def run_searches(
    model: Any, loss_fn: Any, batches: list[Any], args: Any
) -> tuple[Any, dict[str, Any]]:
    """Both searches; returns (the ranker search's step function, on its best strategy; the records)."""
    import keras
    import tensorflow as tf

    from kungfu_tf.elastic import function as step_function
    from kungfu_tf.optimizers import SynchronousSGDOptimizer
    from kungfu_tf.strategy import builders
    from kungfu_tf.strategy.auto.search_model import AutoDistModel

    info: dict[str, Any] = {}
    chosen_step = None
    for mode in SEARCH_MODES:
        use_ranker = mode == "ranker"

        def search_model(variables: Any, cluster: Any, use_ranker: bool = use_ranker) -> Any:
            return AutoDistModel.calibrated(variables, cluster, use_ranker=use_ranker)

        auto = builders.Auto(
            budget=args.auto_budget,
            trial_steps=args.steps,
            warmup=max(1, args.warmup),
            trials_per_round=args.auto_trials_per_round,
            seed=args.auto_seed,
            search_model=search_model,
        )
        opt = SynchronousSGDOptimizer(
            keras.optimizers.SGD(args.lr, momentum=args.momentum), strategy=auto
        )

        def make_step(opt: Any) -> Any:
            @step_function  # traced again after each switch of the search
            def train_step(x: Any, y: tf.Tensor) -> tf.Tensor:
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
                return loss

            return train_step

        step = make_step(opt)
        started = time.monotonic()
        i = 0
        while auto.result is None:
            float(step(*batches[i % len(batches)]))
            i += 1
        result = auto.result
        info[mode] = {
            "chosen": result.best.id,
            "best_trial_s": result.best_seconds,
            "search_s": time.monotonic() - started,
            "steps": i,
            "trials": [dataclasses.asdict(r) for r in result.records],
        }
        if use_ranker:
            chosen_step = step
    return chosen_step, info
