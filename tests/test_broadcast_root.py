"""``broadcast``/``reduce`` refuse a root that is not a rank instead of truncating it.

Runs in this process as a one-worker cluster (no launcher), so a root of 0 is
the only valid one and ``int(1.9) == 1`` would have been caught by the runtime
only as "root 1 outside a cluster of 1"; here ``0.9`` would have become 0 and
silently worked.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf import ops


@pytest.fixture(params=["broadcast", "reduce"])
def rooted(request):
    return {"broadcast": ops.broadcast, "reduce": ops.reduce}[request.param], request.param


@pytest.mark.parametrize(
    "root, error, words",
    [
        (0.9, TypeError, "0.9"),
        (1.9, TypeError, "1.9"),
        (np.float64(0.0), TypeError, "0.0"),
        (False, TypeError, "bool False"),
        (np.bool_(False), TypeError, "bool np.False_"),
        ("0", TypeError, "'0'"),
        (None, TypeError, "None"),
        (-1, ValueError, "-1"),
        (np.int64(-2), ValueError, "-2"),
    ],
)
def test_bad_root_is_refused_naming_it(rooted, root, error, words):
    fn, what = rooted
    with pytest.raises(error) as err:
        fn(tf.constant([1.0, 2.0]), root=root)
    assert f"{what}: root" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("root", [tf.constant(0.5), tf.constant([0, 1]), tf.constant(True)])
def test_bad_tensor_root_is_refused(rooted, root):
    fn, what = rooted
    with pytest.raises(TypeError, match=f"{what}: root must be an integer scalar"):
        fn(tf.constant([1.0]), root=root)


def test_root_computed_at_run_time_is_refused(rooted):
    fn, what = rooted

    @tf.function(input_signature=[tf.TensorSpec([], tf.int32)])
    def step(root):
        return fn(tf.constant([1.0]), root=root)

    with pytest.raises(TypeError, match=f"{what}: root must be known when the op is built"):
        step(tf.constant(0))


@pytest.mark.parametrize("root", [0, np.int32(0), np.int64(0), tf.constant(0), tf.constant(0, tf.int64)])
def test_integer_roots_work(rooted, root):
    fn, _ = rooted
    x = np.array([1.0, 2.0], np.float32)
    np.testing.assert_array_equal(fn(tf.constant(x), root=root).numpy(), x)

    @tf.function
    def traced():
        return fn(tf.constant(x), root=tf.constant(0))

    np.testing.assert_array_equal(traced().numpy(), x)


def test_root_outside_the_cluster_fails_when_run():
    with pytest.raises(tf.errors.InvalidArgumentError, match="root 1 outside a cluster of 1"):
        ops.broadcast(tf.constant([1.0]), root=1)
