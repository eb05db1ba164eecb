"""Worker for tests/test_strategy_switch.py: strategies switched mid-run train like one process.

Usage: strategy_switch.py

Every part trains a small MLP with Adam (two slots per variable, built lazily
at the first step, as users do), each worker on its own B-row shard of every
global batch, from identical weights; rank 0 also trains the same model in
this process with plain Adam on the whole batches. The weights must agree
(RTOL/ATOL: float32, summation order only), and a consensus checks that
every worker holds the same.

* function: a ``kungfu_tf.elastic.function`` loop that switches
  PS (owner: the last rank) -> AllReduce -> PartitionedPS (every kernel cut);
  the step is traced once per strategy; after each switch the optimizer's
  slots exist for exactly what this rank updates.
* fit: Keras ``fit`` with a callback that switches at batches 2 and 4
  (``switch_strategy(..., model=model)``).
* policy: Keras ``fit`` with a ``StrategyPolicy`` whose scorer (injected
  scores that change at step 3) makes it switch twice; the decision log
  names both switches.
* cost-model: the same with ``CostModelScorer`` (AutoDist's cost model on
  link rates calibrated at each scoring): whatever it picks, the weights
  equal the reference.
* refusals, each the same precise ``StrategyError`` on every worker with
  nothing changed (plan, generation, weights), and training goes on: the
  workers ask for different strategies; an unknown builder name (on every
  worker, then on rank 1 only); a strategy for other variables.
"""

from __future__ import annotations

import _setup
import keras
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.keras import PolicyCallback
from kungfu_tf.optimizers import SynchronousSGDOptimizer, switch_strategy
from kungfu_tf.policy import CostModelScorer, StrategyPolicy
from kungfu_tf.strategy import builders, plan_generation
from kungfu_tf.strategy import format as strategy_format
from kungfu_tf.strategy.errors import StrategyError

STEPS, B, LR = 6, 4, 0.01
RTOL, ATOL = 1e-4, 1e-5
SMALL = 64  # partition threshold (bytes): both kernels are cut


def fresh_model() -> keras.Model:
    keras.backend.clear_session()  # the same variable names on every worker
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(3)])


def data(size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(9)
    return rng.normal(size=(STEPS * size * B, 8)).astype(np.float32), rng.integers(0, 3, STEPS * size * B).astype(np.int32)


def shard(x: np.ndarray, rank: int, size: int) -> np.ndarray:
    rows = np.arange(STEPS * size * B).reshape(STEPS, size, B)[:, rank].reshape(-1)
    return x[rows]


def loss_fn() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def weights(model: keras.Model) -> list[np.ndarray]:
    return [v.numpy() for v in model.trainable_variables]


def agree(chk: Checker, got: list, what: str) -> None:
    flat = np.concatenate([np.asarray(w, np.float64).reshape(-1) for w in got])
    chk.true(bool(ops.consensus(tf.constant(flat), name=f"agree/{what}").numpy()), f"{what}: workers differ")


def close(chk: Checker, got: list, want: list, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or not np.allclose(g, w, rtol=RTOL, atol=ATOL):
            chk.fail(what, f"array {i}: max abs difference {np.max(np.abs(g - w)) if g.shape == w.shape else 'shape'}")
    chk.count += 1


def check_slots(chk: Checker, opt, what: str) -> None:
    """Adam's two slots exist for exactly the variables (or shards) this rank updates under the plan in force."""
    plan = opt._kungfu_plan
    owned = {id(t) for t in plan.targets}
    known = {id(v) for v in opt._trainable_variables}
    chk.true(owned == known, f"{what}: optimizer built on {len(known)} variables, plan updates {len(owned)}")
    slots = [v for v in opt.variables if id(v) not in opt._kungfu_fixed_variable_ids]
    chk.true(len(slots) == 2 * len(owned), f"{what}: {len(slots)} slots for {len(owned)} targets")


SWITCHES = {2: "AllReduce", 4: "PartitionedPS"}


def candidate(name: str, size: int):
    return {
        "PS": builders.PS(owner=size - 1),
        "AllReduce": builders.AllReduce(),
        "PartitionedPS": builders.PartitionedPS(min_partition_bytes=SMALL),
    }[name]


def run_function(chk: Checker, rank: int, size: int, reference: list | None) -> None:
    x, y = data(size)
    xs, ys = shard(x, rank, size), shard(y, rank, size)
    model = fresh_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=candidate("PS", size), name="switch_fn")
    loss = loss_fn()

    @kungfu_tf.elastic.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, model(xb, training=True))
        opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))

    for s in range(STEPS):
        if s in SWITCHES:
            report = switch_strategy(opt, candidate(SWITCHES[s], size))
            chk.true(report.changed and report.slot_kinds == 2, f"function: switch at {s}: {report}")
            print(f"function: switch {report.old_id} -> {report.new_id}: agree {report.agree_seconds:.4f} s, "
                  f"gather {report.gather_seconds:.4f} s, rebuild {report.rebuild_seconds:.4f} s", flush=True)  # fmt: skip
        step(xs[s * B : (s + 1) * B], ys[s * B : (s + 1) * B])
        check_slots(chk, opt, f"function step {s}")
    partitioned = [n for n in opt._kungfu_plan.strategy.node_config if n.part_config]
    chk.true(len(partitioned) >= 2, f"function: PartitionedPS cut {len(partitioned)} variables, expected both kernels")
    chk.true(step.traces == 3, f"function: the step was traced {step.traces} times, expected 3 (once per strategy)")
    got = weights(model)
    agree(chk, got, "function")
    if rank == 0:
        close(chk, got, reference, "function")
    print("ran function", flush=True)
    run_refusals(chk, rank, size, model, opt, step, xs, ys)


def run_refusals(chk: Checker, rank: int, size: int, model, opt, step, xs, ys) -> None:
    other = strategy_format.parse('id: "other" node_config { var_name: "no_such_variable" all_reduce {} }')
    cases = [
        ("mismatch", "AllReduce" if rank == 0 else "PS", "the workers asked for different strategies"),
        ("unknown", "NoSuchBuilder", "rank 0: StrategyError: strategy 'NoSuchBuilder' is neither a file nor a builder"),
        ("unknown-on-rank-1", "NoSuchBuilder" if rank == 1 else "AllReduce", "rank 1: StrategyError: strategy 'NoSuchBuilder'"),
        ("other-variables", other, "the model has no trainable variable 'no_such_variable'"),
    ]  # fmt: skip
    for what, source, expected in cases:
        before = weights(model) + [v.numpy() for v in opt.variables]
        plan, generation = opt._kungfu_plan, plan_generation.current()
        try:
            switch_strategy(opt, source)
            chk.fail(f"refusal/{what}", "no error")
        except StrategyError as e:
            print(f"refusal/{what}: {e}", flush=True)
            chk.true(expected in str(e), f"refusal/{what}: {expected!r} not in {e}")
        after = weights(model) + [v.numpy() for v in opt.variables]
        chk.true(opt._kungfu_plan is plan and plan_generation.current() == generation, f"refusal/{what}: plan changed")
        chk.true(all(np.array_equal(a, b) for a, b in zip(before, after)), f"refusal/{what}: state changed")
    step(xs[:B], ys[:B])  # training goes on with the strategy in force
    agree(chk, weights(model), "after refusals")
    print("ran refusals", flush=True)


class SwitchAt(keras.callbacks.Callback):
    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if batch + 1 in SWITCHES:
            switch_strategy(self.model.optimizer, candidate(SWITCHES[batch + 1], self.size), model=self.model)


def fit(model: keras.Model, opt, x, y, batch: int, callbacks=()) -> keras.Model:
    model.compile(optimizer=opt, loss=loss_fn(), jit_compile=False)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=list(callbacks))
    return model


def injected_scores(candidates, variables, ctx) -> list[float]:
    """Seconds per step as a cost model might predict them: AllReduce best until step 3, PartitionedPS after."""
    chk_ids = [c.id for c in candidates]
    assert chk_ids == ["PS", "AllReduce", "PartitionedPS"], chk_ids
    return [3.0, 1.0, 2.0] if ctx.step < 3 else [3.0, 2.0, 1.0]


def run_fit(chk: Checker, rank: int, size: int, reference: list | None) -> None:
    x, y = data(size)
    xs, ys = shard(x, rank, size), shard(y, rank, size)
    model = fresh_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=candidate("PS", size), name="switch_fit")
    fit(model, opt, xs, ys, B, [SwitchAt(size)])
    chk.true(opt._kungfu_plan.strategy.id == "PartitionedPS", f"fit: ended on {opt._kungfu_plan.strategy.id}")
    check_slots(chk, opt, "fit")
    got = weights(model)
    agree(chk, got, "fit")
    if rank == 0:
        close(chk, got, reference, "fit")
    print("ran fit", flush=True)

    model = fresh_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=candidate("PS", size), name="switch_policy")
    policy = StrategyPolicy(opt, [candidate(n, size) for n in ("PS", "AllReduce", "PartitionedPS")],
                            scorer=injected_scores, rescore_every=2)  # fmt: skip
    callback = PolicyCallback([policy])
    fit(model, opt, xs, ys, B, [callback])
    lines = callback.runner.log_lines
    print("policy log:\n  " + "\n  ".join(lines), flush=True)
    switched = [line for line in lines if "->" in line and "strategy" in line]
    chk.true(len(switched) == 2 and "-> AllReduce" in switched[0] and "-> PartitionedPS" in switched[1],
             f"policy: switches {switched}")  # fmt: skip
    chk.true(any("kept" in line for line in lines), f"policy: no 'kept' decision at step 5: {lines}")
    chk.true(opt._kungfu_plan.strategy.id == "PartitionedPS" and policy.switches == 2, "policy: final strategy")
    got = weights(model)
    agree(chk, got, "policy")
    if rank == 0:
        close(chk, got, reference, "policy")
    print("ran policy", flush=True)

    # The cost model on link rates measured then: whichever it picks, training stays exact.
    model = fresh_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=candidate("PS", size), name="switch_cost")
    policy = StrategyPolicy(opt, [candidate(n, size) for n in ("PS", "AllReduce", "PartitionedPS")],
                            scorer=CostModelScorer(probe_bytes=1 << 16, repeats=2), rescore_every=3)  # fmt: skip
    callback = PolicyCallback([policy])
    fit(model, opt, xs, ys, B, [callback])
    lines = [line for line in callback.runner.log_lines if "every 3 steps; scores" in line]
    print("cost-model log:\n  " + "\n  ".join(lines), flush=True)
    chk.true(len(lines) == 2, f"cost-model: {len(lines)} decisions, expected 2 (steps 2 and 5)")
    got = weights(model)
    agree(chk, got, "cost-model")
    if rank == 0:
        close(chk, got, reference, "cost-model")
    print("ran cost-model", flush=True)


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    function_ref = fit_ref = None
    if rank == 0:
        x, y = data(size)
        model, opt, loss = fresh_model(), keras.optimizers.Adam(LR), loss_fn()
        for s in range(STEPS):
            rows = slice(s * size * B, (s + 1) * size * B)
            with tf.GradientTape() as tape:
                value = loss(y[rows], model(x[rows], training=True))
            opt.apply_gradients(zip(tape.gradient(value, model.trainable_variables), model.trainable_variables))
        function_ref = weights(model)
        fit_ref = weights(fit(fresh_model(), keras.optimizers.Adam(LR), x, y, size * B))
    run_function(chk, rank, size, function_ref)
    run_fit(chk, rank, size, fit_ref)
    chk.done()


if __name__ == "__main__":
    main()
