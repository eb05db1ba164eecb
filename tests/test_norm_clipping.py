"""Keras's clipping by norm (``clipnorm``, ``global_clipnorm``) under parameter servers: as one process clips.

kungfu_tf/strategy/kernels/gradient_clip.py against Keras's own clipping in
one process, and tests/workers/norm_clipping.py at np=2 (PSLoadBalancing,
PartitionedPS, AllReduce, a stale PS refused) against one process trained on
the union batches.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_job_ok, run_job

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.kernels.gradient_clip import GradientClip


def gradients() -> list[tf.Tensor | tf.IndexedSlices]:
    rng = np.random.default_rng(7)
    dense = [tf.constant(rng.standard_normal(shape).astype(np.float32)) for shape in [(5, 3), (3,)]]
    rows = tf.IndexedSlices(tf.constant(rng.standard_normal((4, 3)).astype(np.float32)),
                            tf.constant([2, 0, 2, 5]), tf.constant([6, 3]))  # fmt: skip  # row 2 twice
    return [*dense, rows]


@pytest.mark.parametrize("kind, keyword", [("global", "global_clipnorm"), ("norm", "clipnorm")])
@pytest.mark.parametrize("value", [0.3, 100.0])  # clipping, and not
def test_clipping_from_summed_squared_norms_equals_keras(kind, keyword, value):
    grads = gradients()
    # Keras measures a sparse gradient by its rows as they are (row 2 twice: not summed first).
    want = keras.optimizers.SGD(0.1, **{keyword: value})._clip_gradients(grads)
    clip = GradientClip(kind, value)
    # Each variable's norm from two workers' parts (the sparse one's rows split between them, as
    # average_indexed_slices concatenates the workers' rows).
    rows = grads[2]
    parts = [tf.IndexedSlices(rows.values[:2], rows.indices[:2], rows.dense_shape),
             tf.IndexedSlices(rows.values[2:], rows.indices[2:], rows.dense_shape)]  # fmt: skip
    total = clip.squared_norms([grads[0], parts[0]], [0, 2], 3) + clip.squared_norms([grads[1], parts[1]], [1, 2], 3)
    got = clip.apply(grads, [0, 1, 2], total)
    for g, w in zip(got, want):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(w).numpy(), rtol=1e-6, atol=1e-7)


def test_a_non_finite_norm_gives_nan_as_keras_does():
    grads = [tf.constant([np.inf, 1.0])]
    clip = GradientClip("global", 1.0)
    got = clip.apply(grads, [0], clip.squared_norms(grads, [0], 1))
    want = keras.optimizers.SGD(0.1, global_clipnorm=1.0)._clip_gradients(grads)
    assert np.isnan(got[0].numpy()).all() and np.isnan(want[0].numpy()).all()


def test_workers_with_parameter_servers_clip_as_one_process():
    rc, out, err = run_job(2, "norm_clipping.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=5 * 3 + 1)


def test_clipping_by_norm_with_accumulated_gradients_is_refused_under_parameter_servers():
    # Keras clips the accumulated mean on the steps that update; the plan would clip each step's gradients.
    w = keras.Variable(np.ones(3, np.float32), name="w")
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, global_clipnorm=1.0, gradient_accumulation_steps=2),
                                  strategy="PS", name="accumulating")  # fmt: skip
    with pytest.raises(StrategyError, match=r"clipping by norm \(global 1.0\) with gradient_accumulation_steps=2"):
        opt.apply([np.ones(3, np.float32)], [w])
    np.testing.assert_array_equal(w.numpy(), np.ones(3))
