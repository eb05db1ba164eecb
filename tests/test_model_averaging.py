"""SynchronousAveragingOptimizer and PairAveragingOptimizer (kungfu_tf/optimizers).

Multi-worker (tests/workers/model_averaging.py, one launch per N in {2, 3}):
each worker trains the digits MLP (models/digits.py, real data, offline) on
its own shard of the training split.

* SMA (alpha=0.1, SGD+momentum, Model.fit, identical broadcast start, 5
  epochs) and pair averaging (SGD+momentum, tf.function loop calling
  apply_gradients, 220 steps whatever N is) each reach held-out accuracy
  >= 0.90 on the digits test split (measured 0.96 with N=1, pair averaging
  0.964-0.972 at N=3; the threshold leaves margin for the asynchronous pair
  averaging's nondeterminism).
* SMA's averaging step against numpy: a linear model from different
  weights per worker, 3 steps of SGD+momentum with alpha=0.1 (tf.function
  loop and Model.fit), equals numpy's replay of every worker's local step
  and the pull toward the mean (rtol 1e-5).
* SMA with alpha=1.0: after each of 4 steps every worker holds identical
  weights (consensus), and the weights changed.
* Pair averaging, N=2, different initial weights: after one Model.fit step the
  distance between the two models is < 0.5x the initial one, while one step
  of the plain optimizer leaves it > 0.9x.

v1 (tests/workers/model_averaging_v1.py, N in {2, 3}): the same model as a
tf.compat.v1 graph with MonitoredTrainingSession and
BroadcastGlobalVariablesHook; SMA and pair averaging reach >= 0.90 in 220
steps, SMA with alpha=1.0 keeps the workers identical, and at N=2 one pair
step from different weights brings the models together.

In-process (a one-worker cluster): wrapping errors, and that with one worker
both wrappers reduce exactly to the wrapped optimizer (the average of one
model is itself; the only peer is the worker itself).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_job_ok, run_job

with contextlib.suppress(RuntimeError):  # already set if another test ran TF first
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

import keras

from kungfu_tf.optimizers import (
    PairAveragingOptimizer,
    SynchronousAveragingOptimizer,
    SynchronousSGDOptimizer,
)

WRAPPERS = [SynchronousAveragingOptimizer, PairAveragingOptimizer]

# Keep in step with tests/workers/model_averaging.py: sma_fit 1, sma_step 2
# (tf.function, fit), sma_alpha1 4 steps + "changed" 1, pair_function 1,
# pair_closer 2 (N=2 only).
def expected_checks(np_: int) -> int:
    return 1 + 2 + 5 + 1 + (2 if np_ == 2 else 0)


@pytest.mark.parametrize("np_", [2, 3])
def test_training_on_digits(np_):
    rc, out, err = run_job(np_, "model_averaging.py", np_, timeout=180)
    counts = assert_job_ok(rc, out, err, np_)
    assert counts == {r: expected_checks(np_) for r in range(np_)}, out[-4000:]
    assert "MISMATCH" not in err


# Keep in step with tests/workers/model_averaging_v1.py: v1_sma 1, v1_sma_alpha1
# 4 steps + "changed" 1, v1_pair 2, v1_pair_closer 2 (N=2 only).
def expected_v1_checks(np_: int) -> int:
    return 1 + 5 + 2 + (2 if np_ == 2 else 0)


@pytest.mark.parametrize("np_", [2, 3])
def test_v1_training_on_digits(np_):
    rc, out, err = run_job(np_, "model_averaging_v1.py", np_, timeout=120)
    counts = assert_job_ok(rc, out, err, np_)
    assert counts == {r: expected_v1_checks(np_) for r in range(np_)}, out[-4000:]


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_v1_optimizers_are_wrapped(wrapper):
    inner = tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)
    opt = wrapper(inner, name=f"v1_{wrapper.__name__}")
    assert isinstance(opt, tf.compat.v1.train.Optimizer)
    assert opt._optimizer is inner
    with pytest.raises(ValueError, match="already"):
        wrapper(opt)


@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_wrapping_twice_raises_value_error(wrapper):
    with pytest.raises(ValueError, match="already"):
        wrapper(wrapper(keras.optimizers.SGD(0.1)))
    # Any two kungfu_tf wrappers: nesting would synchronise twice per step.
    with pytest.raises(ValueError, match="already"):
        wrapper(SynchronousSGDOptimizer(keras.optimizers.SGD(0.1)))
    with pytest.raises(ValueError, match="already"):
        SynchronousSGDOptimizer(wrapper(keras.optimizers.SGD(0.1)))


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize(
    "not_an_optimizer",
    ["sgd", tf.Module(), None, keras.layers.Dense(1)],
)
def test_non_optimizer_raises_type_error(wrapper, not_an_optimizer):
    with pytest.raises(TypeError, match=r"keras.optimizers.Optimizer \(Keras 3\) or a tf.compat.v1.train.Optimizer"):
        wrapper(not_an_optimizer)


@pytest.mark.parametrize("alpha", [0.0, -0.5, 1.5, True, "0.1"])
def test_bad_alpha_raises_value_error(alpha):
    with pytest.raises(ValueError, match="alpha"):
        SynchronousAveragingOptimizer(keras.optimizers.SGD(0.1), alpha=alpha)


def _train(opt: keras.optimizers.Optimizer, use_fit: bool) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 5)).astype(np.float32)
    y = rng.normal(size=(16, 2)).astype(np.float32)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(2)])
    model.set_weights([(0.5 * rng.normal(size=w.shape)).astype(np.float32) for w in model.get_weights()])
    if use_fit:
        model.compile(optimizer=opt, loss="mse", jit_compile=False)
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    else:

        @tf.function
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xb) - yb))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))

        for s in range(4):
            step(x[4 * s : 4 * s + 4], y[4 * s : 4 * s + 4])
    return model.get_weights() + [v.numpy() for v in opt.variables]


@pytest.mark.parametrize("use_fit", [True, False], ids=["fit", "function"])
@pytest.mark.parametrize("wrapper", WRAPPERS)
def test_one_worker_equals_wrapped_optimizer(wrapper, use_fit):
    def adam() -> keras.optimizers.Optimizer:
        return keras.optimizers.Adam(0.05)

    name = f"one_worker_{wrapper.__name__}_{use_fit}"
    got = _train(wrapper(adam(), name=name), use_fit)
    want = _train(adam(), use_fit)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
