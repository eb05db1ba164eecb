"""``after_gradients``: a step's update, counters included, waits for its gradients.

Shared by ``SynchronousSGDOptimizer`` and the strategy optimizers, so that
neither imports the other.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers.gradient_order import after_gradients
    >>> with after_gradients([tf.constant(1.0)]):
    ...     tf.constant(2.0).numpy()
    np.float32(2.0)
"""

from __future__ import annotations

import contextlib
from typing import Any

import tensorflow as tf


def after_gradients(grads: list[Any]) -> Any:
    """Inside tf.function: every op of the update waits for every averaged gradient.

    The update's own ops have data edges to the gradients, but Keras's
    ``iterations.assign_add(1)`` (and an optimizer's other per-step counters)
    has none: when an all-reduce failed (a peer lost), the counter still
    advanced on the survivors, and Adam's bias correction was one step off
    for the rest of the run. The same when the step's input ran out (Keras
    ``fit`` ends an epoch of unknown length with an OutOfRangeError from the
    traced step): no gradient, so no update and no count either. Eagerly the
    averages exist already.
    """
    if tf.executing_eagerly():
        return contextlib.nullcontext()
    tensors = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    return tf.control_dependencies(tensors)
