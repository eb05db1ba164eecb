"""A step applies all of its averaged gradients or none of them (elastic training relies on it).

``average_gradients`` averages each bucket with its own collective. If an
apply could start as soon as its own bucket is averaged, a failure of a
later bucket (a crashed peer) would leave the worker with a partial update,
different from its peers'. The averages pass one ``tf.identity_n``, so every
apply waits for all of them.

The test makes the failure deterministic in one process: bucket 1's
gradient comes from a py_function that waits until variable ``a`` (updated
from bucket 0 only) changes, then fails; without the identity_n, ``a``'s
update runs while it waits and the failed step leaves ``a`` changed. With
it, ``a`` cannot change, the wait times out (1 s) and the step fails with
``a`` untouched.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.optimizers.gradient_sync import average_gradients

WAIT_SECONDS = 1.0


def test_a_failed_bucket_leaves_every_variable_unchanged():
    graph = tf.Graph()  # a v1 graph: no automatic control dependencies to order the ops for us
    with graph.as_default():
        a = tf.compat.v1.get_variable("a", initializer=np.zeros(4, np.float32), use_resource=True)
        b = tf.compat.v1.get_variable("b", initializer=np.zeros(4, np.float32), use_resource=True)
        seen = {}

        def late_failure() -> np.ndarray:
            deadline = time.monotonic() + WAIT_SECONDS
            while time.monotonic() < deadline:
                if seen["session"].run(a)[0] != 0:
                    break
                time.sleep(0.01)
            raise ValueError("bucket 1 failed (a crashed peer)")

        grad_b = tf.compat.v1.py_func(late_failure, [], tf.float32, stateful=True)
        grad_b.set_shape([4])
        grad_a, grad_b = average_gradients([tf.ones([4]), grad_b], fusion_threshold_bytes=0, name="all_or_nothing")
        train = tf.group(a.assign_sub(grad_a), b.assign_sub(grad_b))
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4, intra_op_parallelism_threads=1)
        with tf.compat.v1.Session(graph=graph, config=config) as session:
            seen["session"] = session
            session.run(tf.compat.v1.global_variables_initializer())
            with pytest.raises(tf.errors.OpError, match="bucket 1 failed"):
                session.run(train)
            np.testing.assert_array_equal(session.run(a), np.zeros(4, np.float32), err_msg="a partial update was applied")
            np.testing.assert_array_equal(session.run(b), np.zeros(4, np.float32))


def test_a_failed_step_leaves_the_optimizer_step_counter_unchanged():
    """Keras's ``iterations.assign_add(1)`` has no data edge to the gradients: unless the
    SynchronousSGDOptimizer orders the whole update after the averages, it ran while a gradient
    was still being averaged, so a step that failed (a lost peer) advanced the counter on the
    survivors, and Adam's bias correction was one step off for the rest of the run (the elastic
    Keras test with Adam missed the one-process reference by 0.016 after a crash)."""
    import keras

    from kungfu_tf.optimizers import SynchronousSGDOptimizer

    w = keras.Variable(np.ones(4, np.float32), name="w_counter")
    opt = SynchronousSGDOptimizer(keras.optimizers.Adam(0.1))
    opt.build([w])

    def late_failure() -> np.ndarray:
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            if int(opt.iterations.numpy()) != 0:
                break  # the counter advanced while the gradient was not even computed
            time.sleep(0.01)
        raise RuntimeError("a peer was lost")

    @tf.function
    def step() -> None:
        grad = tf.numpy_function(late_failure, [], tf.float32, stateful=True)
        opt.apply_gradients([(tf.reshape(grad, [4]), w)])

    with pytest.raises(tf.errors.OpError, match="a peer was lost"):
        step()
    assert int(opt.iterations.numpy()) == 0
    np.testing.assert_array_equal(w.numpy(), np.ones(4, np.float32))
