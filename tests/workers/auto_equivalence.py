"""Worker for tests/test_auto_search.py: training through builders.Auto's trials equals one process.

Usage: auto_equivalence.py auto LOG   (np = 2)

N workers train a small model (dense layers and an embedding, whose
gradient is sparse) for STEPS steps with SGD + momentum wrapped in
``SynchronousSGDOptimizer(strategy=builders.Auto(budget=BUDGET, ...))`` in a
``kungfu_tf.elastic.function`` loop, each worker on its own B-row shard of
every global batch. The search's trials are these steps: the starting
all-reduce strategy, a broken candidate (it names a variable the model
lacks: its switch fails on every worker, the search goes on), then sampled
candidates, each for WARMUP + TRIAL_STEPS real steps, the optimizer's slots
moving with every switch; then training goes on with the best.

Every worker also trains the same model in this process with the plain
optimizer on the whole N·B-row batches (no collectives): the weights must
agree within RTOL/ATOL — which holds only if every strategy the trials ran
computed synchronous SGD exactly — and the workers must hold identical
weights (consensus). Rank 0's search log must have a line per trial with
the prediction, and the measurement of every trial but the broken one.

The search model is kungfu_tf.strategy.auto's own (sampler, cost model,
ranker).
"""

from __future__ import annotations

import json
import sys

import _setup
import keras
from _setup import Checker, np, ops, tf

from kungfu_tf.elastic import function as step_function
from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.format import canonical_bytes

STEPS, B = 16, 4
BUDGET, WARMUP, TRIAL_STEPS = 4, 1, 2
LR, MOMENTUM = 0.05, 0.9
RTOL, ATOL = 1e-4, 1e-5
VOCAB, FEATURES = 50, 6


def build_model() -> keras.Model:
    keras.utils.set_random_seed(7)  # the same initial weights on every worker and in the reference
    ids = keras.Input((3,), dtype="int32")
    dense_in = keras.Input((FEATURES,))
    emb = keras.layers.Flatten()(keras.layers.Embedding(VOCAB, 4)(ids))
    h = keras.layers.Dense(16, activation="tanh")(keras.layers.Concatenate()([emb, dense_in]))
    out = keras.layers.Dense(3)(keras.layers.Dense(8, activation="tanh")(h))
    return keras.Model([ids, dense_in], out)


def global_batch(step: int, n: int) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(100 + step)
    ids = rng.integers(0, VOCAB, (n, 3)).astype(np.int32)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.normal(size=(n, 3)).astype(np.float32)
    return [ids, x], y


def main() -> None:
    assert sys.argv[1] == "auto", sys.argv
    log_path = sys.argv[2]
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    broken = strategy_pb2.Strategy(id="broken")
    broken.node_config.add(var_name="no_such_variable").all_reduce.group = 0
    auto = builders.Auto(
        budget=BUDGET, trial_steps=TRIAL_STEPS, warmup=WARMUP, candidates_per_round=8, trials_per_round=2,
        log_path=log_path, extra_candidates=[broken],
        probe_wait_steps=0, confirm_top=0,  # the exact schedule of trials these steps are checked against
    )  # fmt: skip
    model = build_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM), strategy=auto)
    loss_fn = keras.losses.MeanSquaredError()
    tried: list[bytes] = []

    @step_function
    def train_step(inputs, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(inputs, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    for step in range(STEPS):
        inputs, y = global_batch(step, size * B)
        mine = slice(rank * B, (rank + 1) * B)
        train_step([a[mine] for a in inputs], y[mine])
        plan = opt._kungfu_plan
        if not tried or tried[-1] != canonical_bytes(plan.strategy):
            tried.append(canonical_bytes(plan.strategy))

    ref = build_model()
    ref_opt = keras.optimizers.SGD(LR, momentum=MOMENTUM)
    for step in range(STEPS):
        inputs, y = global_batch(step, size * B)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, ref(inputs, training=True))
        ref_opt.apply(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables)

    chk.true(auto.result is not None, "the search finished within the steps")
    records = auto.result.records
    chk.equal(len(records), BUDGET, "trials run")
    chk.equal([r.strategy_id for r in records[:2]], ["AllReduce", "broken"], "the starting and the extra candidate first")
    chk.true(records[1].measured_seconds is None and "StrategyError" in (records[1].error or ""),
             f"the broken candidate failed: {records[1]}")  # fmt: skip
    chk.true(all(r.measured_seconds and r.measured_seconds > 0 for i, r in enumerate(records) if i != 1),
             f"every other trial measured: {records}")  # fmt: skip
    distinct = {canonical_bytes(s) for s in [strategy_pb2.Strategy.FromString(b) for b in tried]}
    chk.true(len(distinct) >= BUDGET - 1, f"training ran under {len(distinct)} different strategies")
    for v, r in zip(model.trainable_variables, ref.trainable_variables, strict=True):
        chk.true(np.allclose(v.numpy(), r.numpy(), rtol=RTOL, atol=ATOL),
                 f"{v.path}: max |diff| {np.max(np.abs(v.numpy() - r.numpy()))}")  # fmt: skip
    flat = np.concatenate([v.numpy().reshape(-1) for v in model.trainable_variables])
    chk.true(bool(ops.consensus(tf.constant(flat), name="check/weights")), "identical weights")
    if rank == 0:
        with open(log_path, encoding="utf-8") as f:
            lines = [json.loads(x) for x in f]
        chk.equal(len(lines), BUDGET, "log lines")
        chk.true(all(x["predicted_seconds"] is not None for i, x in enumerate(lines) if i != 1),
                 "a prediction per trial (but the broken one's, which the cost model cannot score)")  # fmt: skip
        chk.equal(sum(x["measured_seconds"] is None for x in lines), 1, "trials without a measurement")
    print(f"ran {len(distinct)} strategies: {[r.strategy_id for r in records]} best {auto.result.best.id}", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
