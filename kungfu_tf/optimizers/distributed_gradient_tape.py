"""``DistributedGradientTape``: Horovod's custom-loop API, a tape whose gradients are averaged.

A TF2 loop that computes gradients with ``tf.GradientTape`` and applies them
with a plain optimizer becomes synchronous SGD by wrapping the tape; the
averaging is :func:`kungfu_tf.optimizers.average_gradients` (fused
all-reduce of dense gradients, all-gather of ``tf.IndexedSlices``).

Example:
    >>> import tensorflow as tf
    >>> import kungfu_tf
    >>> w = tf.Variable([1.0, 2.0])
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(w * w)
    >>> tape = kungfu_tf.DistributedGradientTape(tape)
    >>> tape.gradient(loss, [w])[0].numpy()  # one worker: unchanged
    array([2., 4.], dtype=float32)
"""

from __future__ import annotations

from typing import Any, Self

import tensorflow as tf

from kungfu_tf.optimizers.gradient_sync import (
    DEFAULT_FUSION_THRESHOLD_BYTES,
    average_gradients,
)

DEFAULT_NAME = "kungfu_gradient_tape"


class DistributedGradientTape:
    """Wraps a ``tf.GradientTape`` so that :meth:`gradient` returns the average over all workers.

    Only :meth:`gradient` changes; everything else (``watch``, ``jacobian``,
    ``stop_recording``, ``reset``, ...) is the wrapped tape's. The wrapper is
    a context manager too, so both Horovod spellings work. Apply the result
    with a plain optimizer: wrapping the optimizer as well
    (:func:`~kungfu_tf.optimizers.SynchronousSGDOptimizer`) would average the
    averaged gradients again, one extra all-reduce per step for nothing.

    Every worker must ask for gradients of the same sources in the same order
    (the message keys follow positions); ``None`` gradients (sources the
    target does not depend on) stay ``None`` on every worker.

    Args:
        tape: the ``tf.GradientTape`` that recorded the forward pass.
        fusion_threshold_bytes: dense gradients are averaged in fused buckets
            of at most this many bytes (default 64 MiB); 0: one all-reduce
            per gradient.
        sparse_as_dense: all-reduce ``tf.IndexedSlices`` gradients as dense
            tensors instead of all-gathering the slices.
        name: prefix of the collectives' message keys; several tapes in one
            ``tf.function`` are numbered automatically.

    Raises:
        TypeError: ``tape`` is not a ``tf.GradientTape`` (e.g. already a
            ``DistributedGradientTape``).
        ValueError: ``fusion_threshold_bytes`` is not an int >= 0.

    Example:
        >>> import keras
        >>> import tensorflow as tf
        >>> import kungfu_tf
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> opt = keras.optimizers.SGD(0.1)                  # plain: the tape averages
        >>> @tf.function
        ... def step(x, y):
        ...     with tf.GradientTape() as tape:
        ...         loss = tf.reduce_mean((model(x) - y) ** 2)
        ...     tape = kungfu_tf.DistributedGradientTape(tape)
        ...     grads = tape.gradient(loss, model.trainable_variables)
        ...     opt.apply_gradients(zip(grads, model.trainable_variables))
        ...     return loss
    """

    def __init__(
        self,
        tape: tf.GradientTape,
        fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD_BYTES,
        sparse_as_dense: bool = False,
        name: str | None = None,
    ) -> None:
        if not isinstance(tape, tf.GradientTape):
            again = " (wrap the tf.GradientTape once)" if isinstance(tape, DistributedGradientTape) else ""
            raise TypeError(
                "DistributedGradientTape wraps a tf.GradientTape, got "
                f"{type(tape).__module__}.{type(tape).__qualname__}{again}"
            )
        if not isinstance(fusion_threshold_bytes, int) or fusion_threshold_bytes < 0:
            raise ValueError(f"fusion_threshold_bytes must be an int >= 0, got {fusion_threshold_bytes!r}")
        self._tape = tape
        self._fusion_threshold_bytes = fusion_threshold_bytes
        self._sparse_as_dense = sparse_as_dense
        self._name = name or DEFAULT_NAME

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None, **kwargs: Any) -> Any:
        """``tape.gradient(target, sources, ...)`` averaged over all workers, in the structure of ``sources``.

        Example:
            >>> # grads = kungfu_tf.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
        """
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat = tf.nest.flatten(grads, expand_composites=False)
        averaged = average_gradients(flat, self._fusion_threshold_bytes, self._sparse_as_dense, name=self._name)
        return tf.nest.pack_sequence_as(grads, averaged)

    def __enter__(self) -> Self:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._tape.__exit__(*exc)

    def __getattr__(self, attr: str) -> Any:
        # Only reached for what this class does not define: the tape's own API.
        if attr == "_tape":  # not set yet (e.g. during copy): no recursion
            raise AttributeError(attr)
        return getattr(self._tape, attr)
