"""What the Keras and the v1 pair-averaging optimizers share.

The model travels as one flat tensor (:func:`flat`, :func:`assign_flat`)
between this worker and a peer drawn by :func:`random_peer`. Both forms
import this module; neither imports the other's internals.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers._pair_averaging_parts import flat
    >>> flat([tf.ones([2, 2]), tf.zeros([1])]).numpy()
    array([1., 1., 1., 1., 0.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kungfu_tf import ops

DEFAULT_NAME = "kungfu_pair_averaging"


def flat(variables: list[Any]) -> tf.Tensor:
    """All variables in one 1-D tensor (the unit that is saved and requested)."""
    return tf.concat([tf.reshape(tf.convert_to_tensor(v), [-1]) for v in variables], axis=0)


def assign_flat(variables: list[Any], values: tf.Tensor) -> list[Any]:
    """Assigns consecutive pieces of ``values`` (as made by :func:`flat`) to ``variables``."""
    assigns, offset = [], 0
    for v in variables:
        n = v.shape.num_elements()
        assigns.append(v.assign(tf.reshape(values[offset : offset + n], v.shape)))
        offset += n
    return assigns


def random_peer() -> tf.Tensor:
    """A rank drawn uniformly among the other workers; this worker's own rank if it is alone."""
    rank, size = ops.rank(), ops.cluster_size()
    # offset in [0, size - 2], so rank + 1 + offset never wraps onto rank;
    # with size 1, maxval 1 gives offset 0 and (0 + 1 + 0) % 1 = 0 = self.
    offset = tf.random.uniform([], 0, tf.maximum(size - 1, 1), dtype=tf.int32)
    return (rank + 1 + offset) % size
