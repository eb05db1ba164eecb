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

from kungfu_tf.strategy.kernels.gradient_clip import GradientClip, squared_norms


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
    want = keras.optimizers.SGD(0.1, **{keyword: value})._clip_gradients([tf.convert_to_tensor(g) for g in grads])
    # Each variable's norm from two workers' parts: the sparse one's rows split between them.
    first, second = [grads[0], grads[2]], [grads[1]]
    total = squared_norms(first, [0, 2], 3) + squared_norms(second, [1], 3)
    got = GradientClip(kind, value).apply(grads, [0, 1, 2], total)
    for g, w in zip(got, want):
        np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(), w.numpy(), rtol=1e-6, atol=1e-7)


def test_a_non_finite_norm_gives_nan_as_keras_does():
    grads = [tf.constant([np.inf, 1.0])]
    got = GradientClip("global", 1.0).apply(grads, [0], squared_norms(grads, [0], 1))
    want = keras.optimizers.SGD(0.1, global_clipnorm=1.0)._clip_gradients(grads)
    assert np.isnan(got[0].numpy()).all() and np.isnan(want[0].numpy()).all()


def test_workers_with_parameter_servers_clip_as_one_process():
    rc, out, err = run_job(2, "norm_clipping.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=4 * 3 + 1)
