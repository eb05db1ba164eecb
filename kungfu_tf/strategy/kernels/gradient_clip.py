"""Clipping by norm where no worker holds every averaged gradient: parameter servers and their shards.

Keras clips in ``apply`` (``clipnorm``: each variable's gradient by its own
L2 norm; ``global_clipnorm``: all of them by their joint norm). Under
parameter servers each owner applies only the averaged gradients of what it
owns, so Keras there clips by the norm of a subset: the joint norm of the
owner's variables, or one shard's norm for a partitioned variable. Training
silently left one process's. Here each worker sums the squares of what it
updates, per model variable; one all-reduce (the one that already tells every
worker the step's synchronisation completed everywhere) gives every worker
every variable's squared norm, and the gradients are clipped as Keras clips
them, before the wrapped optimizer (whose own clipping is then turned off)
applies them. ``clipvalue`` is element-wise: it needs nothing of this.

Example:
    >>> import tensorflow as tf
    >>> clip = GradientClip("global", 1.0)
    >>> g = [tf.constant([3.0, 4.0])]  # joint norm 5
    >>> [t.numpy().tolist() for t in clip.apply(g, [0], clip.squared_norms(g, [0], 1))]
    [[0.6000000238418579, 0.800000011920929]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import tensorflow as tf


def squared_norm(g: tf.Tensor | tf.IndexedSlices) -> tf.Tensor:
    """The squared L2 norm of ``g`` as a float32 scalar; of a sparse gradient's rows as they are (two rows
    of one index count apart, not summed first), as Keras measures it for both kinds of clipping."""
    values = g.values if isinstance(g, tf.IndexedSlices) else g
    return tf.reduce_sum(tf.square(tf.cast(values, tf.float32)))


def _map(g: tf.Tensor | tf.IndexedSlices, fn: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor | tf.IndexedSlices:
    if isinstance(g, tf.IndexedSlices):
        return tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape)
    return fn(g)


@dataclass(frozen=True)
class GradientClip:
    """Keras's ``clipnorm`` (``kind="norm"``) or ``global_clipnorm`` (``kind="global"``) of ``value``.

    Example:
        >>> import tensorflow as tf
        >>> clip = GradientClip("norm", 1.0)
        >>> grads = [tf.constant([3.0, 4.0]), tf.constant([0.3, 0.4])]  # norms 5 and 0.5
        >>> clipped = clip.apply(grads, [0, 1], clip.squared_norms(grads, [0, 1], 2))
        >>> [[round(float(x), 2) for x in g] for g in clipped]
        [[0.6, 0.8], [0.3, 0.4]]
    """

    kind: Literal["norm", "global"]
    value: float

    def squared_norms(self, grads: Sequence[Any], variable_of: Sequence[int], variables: int) -> tf.Tensor:
        """Per model variable, the sum of the squared norms of ``grads`` (``variable_of[i]``: the model variable
        of ``grads[i]``); a float32 vector of length ``variables``, zero for those with none here."""
        per_variable: list[Any] = [tf.constant(0.0)] * variables
        for g, vi in zip(grads, variable_of):
            per_variable[vi] = per_variable[vi] + squared_norm(g)
        return tf.stack(per_variable)

    def apply(self, grads: Sequence[Any], variable_of: Sequence[int], total: tf.Tensor) -> list[Any]:
        """``grads`` clipped, given ``total``: every model variable's squared norm over all workers."""
        c = tf.constant(self.value, tf.float32)
        if self.kind == "global":
            # As keras.src.optimizers.base_optimizer.clip_by_global_norm: NaN (not 1) when the norm is not finite.
            norm = tf.sqrt(tf.reduce_sum(total))
            scale = c * tf.minimum(1.0 / norm, 1.0 / c) + (norm - norm)
            return [_map(g, lambda v: v * tf.cast(scale, v.dtype)) for g in grads]
        out = []
        for g, vi in zip(grads, variable_of):
            # As tf.clip_by_norm (Keras's TF backend): a zero gradient stays zero, a NaN one NaN. The scale in
            # float32: a float16 norm beyond 65504 would be inf and zero the gradient.
            l2sum = total[vi]
            positive = l2sum > 0
            l2norm = tf.where(positive, tf.sqrt(tf.where(positive, l2sum, 1.0)), l2sum)
            scale = c / tf.maximum(l2norm, c)
            out.append(_map(g, lambda v, s=scale: v * tf.cast(s, v.dtype)))
        return out
