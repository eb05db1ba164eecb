"""Worker for tests/test_auto_fit.py: builders.Auto searching in Keras ``fit``, and where it cannot.

Usage: auto_fit.py MODE LOG   (np = 2; MODE: fit, fit-dataset, fit-steps-per-execution,
                                         fit-without-callback, tf-function)

* ``fit``: ``model.fit`` of a small MLP with Adam (slots built lazily, moved at
  every switch) wrapped in ``SynchronousSGDOptimizer(strategy=builders.Auto(
  budget=BUDGET, trial_steps=2, ...))`` and ``kungfu_tf.keras.AutoSearchCallback()``.
  The trials are fit's own batches, across an epoch's end: the starting
  all-reduce, a broken candidate (it names a variable the model lacks: its
  switch fails on every worker; scored, not fatal) and sampled candidates;
  then training goes on with the best. Checked: the search finished with
  BUDGET trials, the broken one failed and the others were measured, every
  worker chose the same strategy (consensus on its bytes) and trains on it,
  no batch was lost or repeated (the optimizer counted every batch once),
  and the weights equal those of one process trained by ``fit`` on the union
  batches (the plain Adam, no collectives), identical on every worker.
* ``fit-dataset``: the same from a ``tf.data`` input of unknown length, whose
  first epoch ends (OutOfRangeError) in the middle of a trial: the trial
  goes on in the next epoch, not scored as the candidate's failure.
* ``fit-steps-per-execution``: the same with ``compile(steps_per_execution=2)``:
  a trial's step is one call of fit's train function, two batches; the search
  needs more epochs for its calls, and every batch is still counted once.
* ``fit-without-callback``: the same ``fit`` without the callback must stop
  with a StrategyError naming ``AutoSearchCallback`` (not train on the
  starting strategy without a word).
* ``tf-function``: a plain ``tf.function`` step must stop with a
  StrategyError naming ``kungfu_tf.elastic.function``.
"""

from __future__ import annotations

import sys

import _setup
import keras
from _setup import Checker, np, ops, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes

EPOCHS, STEPS_PER_EPOCH, B = 2, 6, 8
BUDGET, WARMUP, TRIAL_STEPS = 4, 1, 2
LR = 0.01
RTOL, ATOL = 1e-4, 1e-5
FEATURES, CLASSES = 8, 3


def build_model() -> keras.Model:
    keras.utils.set_random_seed(11)  # the same initial weights on every worker and in the reference
    return keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(32, activation="tanh"),
        keras.layers.Dense(16, activation="tanh"),
        keras.layers.Dense(CLASSES),
    ])  # fmt: skip


def union_data(size: int) -> tuple[np.ndarray, np.ndarray]:
    """All rows of one epoch, in global-batch order: batch s is rows [s*size*B, (s+1)*size*B)."""
    rng = np.random.default_rng(5)
    n = STEPS_PER_EPOCH * size * B
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = rng.normal(size=(n, CLASSES)).astype(np.float32)
    return x, y


def shard(a: np.ndarray, rank: int, size: int) -> np.ndarray:
    """This worker's B rows of every global batch."""
    return a.reshape(STEPS_PER_EPOCH, size, B, *a.shape[1:])[:, rank].reshape(-1, *a.shape[1:])


def make_auto(log_path: str) -> builders.Auto:
    broken = strategy_pb2.Strategy(id="broken")
    broken.node_config.add(var_name="no_such_variable").all_reduce.group = 0
    return builders.Auto(
        budget=BUDGET, trial_steps=TRIAL_STEPS, warmup=WARMUP, candidates_per_round=8, trials_per_round=2,
        log_path=log_path, extra_candidates=[broken],
        probe_wait_steps=0, confirm_top=0,  # the exact schedule of trials fit's batches are checked against
    )  # fmt: skip


def compiled(optimizer: keras.optimizers.Optimizer, steps_per_execution: int = 1) -> keras.Model:
    model = build_model()
    model.compile(optimizer=optimizer, loss="mse", jit_compile=False, steps_per_execution=steps_per_execution)
    return model


def unknown_length(x: np.ndarray, y: np.ndarray) -> tf.data.Dataset:
    """Batches of B rows whose count Keras cannot know: its first epoch ends when the input runs out."""
    ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True).batch(B)
    assert int(ds.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    return ds


def run_fit(
    chk: Checker, rank: int, size: int, log_path: str, from_dataset: bool = False, steps_per_execution: int = 1
) -> None:
    import kungfu_tf.keras as kfk

    # The search's calls (WARMUP + TRIAL_STEPS per candidate but the broken one) must end within fit.
    epochs = EPOCHS * steps_per_execution
    auto = make_auto(log_path)
    x, y = union_data(size)
    model = compiled(SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=auto), steps_per_execution)
    xs, ys = shard(x, rank, size), shard(y, rank, size)
    callbacks = [kfk.AutoSearchCallback()]
    if from_dataset:  # the trial in progress at the first epoch's end goes on in the next epoch
        model.fit(unknown_length(xs, ys), epochs=epochs, verbose=0, callbacks=callbacks)
    else:
        model.fit(xs, ys, batch_size=B, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks)
    opt = model.optimizer

    reference = compiled(keras.optimizers.Adam(LR))
    reference.fit(x, y, batch_size=size * B, epochs=epochs, shuffle=False, verbose=0)

    chk.true(auto.result is not None, "the search finished within fit")
    records = auto.result.records
    chk.equal(len(records), BUDGET, "trials run")
    chk.equal([r.strategy_id for r in records[:2]], ["AllReduce", "broken"], "the starting and the extra candidate first")
    chk.true(records[1].measured_seconds is None and "StrategyError" in (records[1].error or ""),
             f"the broken candidate failed, scored: {records[1]}")  # fmt: skip
    chk.true(all(r.measured_seconds and r.measured_seconds > 0 for i, r in enumerate(records) if i != 1),
             f"every other trial measured: {records}")  # fmt: skip
    best = canonical_bytes(auto.result.best)
    chk.true(bool(ops.consensus(tf.constant(np.frombuffer(best, np.uint8)), name="check/best")),
             "every worker chose the same strategy")  # fmt: skip
    chk.equal(opt._kungfu_plan.strategy.id, auto.result.best.id, "training goes on with the best strategy")
    chk.equal(int(opt.iterations.numpy()), epochs * STEPS_PER_EPOCH, "optimizer steps (every batch once)")
    for v, r in zip(model.trainable_variables, reference.trainable_variables, strict=True):
        chk.true(np.allclose(v.numpy(), r.numpy(), rtol=RTOL, atol=ATOL),
                 f"{v.path}: max |diff| {np.max(np.abs(v.numpy() - r.numpy()))}")  # fmt: skip
    flat = np.concatenate([v.numpy().reshape(-1) for v in model.trainable_variables])
    chk.true(bool(ops.consensus(tf.constant(flat), name="check/weights")), "identical weights")
    print(f"chose {auto.result.best.id!r} from {[r.strategy_id for r in records]}", flush=True)


def expect_refusal(chk: Checker, train, names: str) -> None:
    try:
        train()
    except StrategyError as e:
        chk.true(names in str(e) and "builders.Auto" in str(e), f"the error names {names}: {e}")
        print(f"refused: {e}", flush=True)
        return
    chk.fail(f"training ran without searching and without an error (expected one naming {names})")


def run_fit_without_callback(chk: Checker, rank: int, size: int, log_path: str) -> None:
    x, y = union_data(size)
    model = compiled(SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=make_auto(log_path)))
    expect_refusal(chk, lambda: model.fit(shard(x, rank, size), shard(y, rank, size), batch_size=B, epochs=1,
                                          shuffle=False, verbose=0), "AutoSearchCallback")  # fmt: skip


def run_tf_function(chk: Checker, rank: int, size: int, log_path: str) -> None:
    x, y = union_data(size)
    model = build_model()
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(LR), strategy=make_auto(log_path))

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    def train():
        xs, ys = shard(x, rank, size), shard(y, rank, size)
        for s in range(STEPS_PER_EPOCH):
            step(xs[s * B : (s + 1) * B], ys[s * B : (s + 1) * B])

    expect_refusal(chk, train, "kungfu_tf.elastic.function")


MODES = {
    "fit": run_fit,
    "fit-dataset": lambda *args: run_fit(*args, from_dataset=True),
    "fit-steps-per-execution": lambda *args: run_fit(*args, steps_per_execution=2),
    "fit-without-callback": run_fit_without_callback, "tf-function": run_tf_function,
}


def main() -> None:
    mode, log_path = sys.argv[1], sys.argv[2]
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    MODES[mode](chk, rank, size, log_path)
    chk.done()


if __name__ == "__main__":
    main()
