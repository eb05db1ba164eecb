"""Worker for tests/test_strategy_policy_trial.py: ``StrategyPolicy`` without a scorer measures every candidate.

Usage: strategy_trial.py

A small MLP trained with Adam (slots built lazily) in a
``kungfu_tf.elastic.function`` loop driven by a ``PolicyRunner``; each worker
trains on its own B-row shard of every global batch, from identical weights.
The policy (candidates PS, AllReduce, PartitionedPS; no scorer: trials)
re-scores every ``RESCORE`` steps. AllReduce is the better candidate by
construction: the training loop sleeps ``PENALTY`` seconds inside every step
taken under PS or PartitionedPS (what a slow link would cost those
strategies), far more than a step of this model takes even on a loaded
machine. Every worker prints its decision log; rank 0 also trains the same
model in this process with plain Adam on the whole batches, and the final
weights must equal that (float32, summation order only).
"""

from __future__ import annotations

import time

import _setup
import keras
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.policy import PolicyRunner, StrategyPolicy
from kungfu_tf.strategy import builders

B, LR = 4, 0.01
RESCORE, TRIAL_STEPS, SETTLE_STEPS = 4, 2, 1
# The trigger fires after step RESCORE - 1; the trial then takes settle + trial steps per candidate, and two
# steps run under the winner (the trigger is not checked during a trial, so it does not fire again).
CANDIDATES = ("PS", "AllReduce", "PartitionedPS")
STEPS = RESCORE + len(CANDIDATES) * (SETTLE_STEPS + TRIAL_STEPS) + 2
SLOW = {"PS", "PartitionedPS"}
PENALTY = 1.0  # seconds
RTOL, ATOL = 1e-4, 1e-5


def fresh_model() -> keras.Model:
    keras.backend.clear_session()  # the same variable names on every worker
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])


def data(size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(9)
    n = STEPS * size * B
    return rng.normal(size=(n, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def shard(x: np.ndarray, rank: int, size: int) -> np.ndarray:
    rows = np.arange(STEPS * size * B).reshape(STEPS, size, B)[:, rank].reshape(-1)
    return x[rows]


def candidate(name: str, size: int) -> builders.StrategyBuilder:
    return {
        "PS": builders.PS(owner=size - 1),
        "AllReduce": builders.AllReduce(),
        "PartitionedPS": builders.PartitionedPS(min_partition_bytes=64),
    }[name]


def reference(size: int) -> list[np.ndarray]:
    """One process, plain Adam, the union of every step's shards."""
    x, y = data(size)
    model, opt = fresh_model(), keras.optimizers.Adam(LR)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    for s in range(STEPS):
        rows = slice(s * size * B, (s + 1) * size * B)
        with tf.GradientTape() as tape:
            value = loss(y[rows], model(x[rows], training=True))
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
    return [v.numpy() for v in model.trainable_variables]


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    want = reference(size) if rank == 0 else None

    x, y = data(size)
    xs, ys = shard(x, rank, size), shard(y, rank, size)
    model = fresh_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=candidate("PS", size), name="trial")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    # max_probe_wait_steps=0: the schedule below is exact; waiting for AUTO's probes adds a number of steps
    # that depends on the probes (tests/test_strategy_switch_units.py, make bench-strategy-policy).
    policy = StrategyPolicy(opt, [candidate(n, size) for n in CANDIDATES], rescore_every=RESCORE,
                            trial_steps=TRIAL_STEPS, settle_steps=SETTLE_STEPS, max_probe_wait_steps=0)  # fmt: skip

    @kungfu_tf.elastic.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    runner = PolicyRunner([policy], batch_size=size * B, verbose=False)
    in_force = []
    with runner.training():
        for s in range(STEPS):
            with runner.step():
                step(xs[s * B : (s + 1) * B], ys[s * B : (s + 1) * B])
                strategy = opt._kungfu_plan.strategy.id  # the plan this step ran with (built at the first)
                in_force.append(strategy)
                if strategy in SLOW:
                    time.sleep(PENALTY)
    for line in runner.log_lines:
        print(f"log: {line}", flush=True)
    print(f"in force: {','.join(in_force)}", flush=True)
    print(f"final: {opt._kungfu_plan.strategy.id} switches {policy.switches}", flush=True)

    got = [v.numpy() for v in model.trainable_variables]
    flat = np.concatenate([g.astype(np.float64).reshape(-1) for g in got])
    chk.true(bool(ops.consensus(tf.constant(flat), name="trial/weights").numpy()), "workers hold different weights")
    if rank == 0:
        for i, (g, w) in enumerate(zip(got, want)):
            if not np.allclose(g, w, rtol=RTOL, atol=ATOL):
                chk.fail("weights differ from one process", f"array {i}: max abs difference {np.max(np.abs(g - w))}")
        chk.count += 1
    chk.done()


if __name__ == "__main__":
    main()
