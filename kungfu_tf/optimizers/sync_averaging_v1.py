"""Synchronous model averaging (SMA) for ``tf.compat.v1.train.Optimizer``.

The v1 form of :func:`kungfu_tf.optimizers.SynchronousAveragingOptimizer`:
the wrapped optimizer applies this worker's own gradients, then every
variable moves ``alpha`` of the way toward the all-reduced mean of the
workers' updated variables.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers.sync_averaging_v1 import SynchronousAveragingOptimizerV1
    >>> opt = SynchronousAveragingOptimizerV1(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9), alpha=0.1)
    >>> opt.get_name()
    'kungfu_sync_averaging'
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kungfu_tf import ops
from kungfu_tf.optimizers.v1_wrapper import WrappedOptimizerV1, unwrap_pairs

DEFAULT_NAME = "kungfu_sync_averaging"


class SynchronousAveragingOptimizerV1(WrappedOptimizerV1):
    """Local step with the wrapped optimizer, then ``v ← v + alpha·(mean(v) − v)``.

    Args:
        optimizer: the ``tf.compat.v1.train.Optimizer`` to wrap.
        alpha: how far each variable moves toward the average, in (0, 1]
            (checked by :func:`SynchronousAveragingOptimizer`).
        name: optimizer name and message-key prefix.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.optimizers import SynchronousAveragingOptimizer
        >>> with tf.Graph().as_default():
        ...     w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
        ...     opt = SynchronousAveragingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        ...     train_op = opt.minimize(tf.reduce_sum(w * w))
    """

    _kungfu_wrapper = "SynchronousAveragingOptimizer"

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, alpha: float = 0.1, name: str | None = None) -> None:
        super().__init__(optimizer, name or DEFAULT_NAME)
        self._alpha = float(alpha)

    def apply_gradients(
        self, grads_and_vars: Any, global_step: tf.Variable | None = None, name: str | None = None
    ) -> tf.Operation:
        """The wrapped optimizer's update, then the pull toward the workers' mean (one fused all-reduce).

        Every variable of ``grads_and_vars`` is averaged, also those whose
        gradient is None: all workers must pass the same tensors.
        """
        grads_and_vars = unwrap_pairs(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        applied = self._optimizer.apply_gradients(
            [(g, v) for g, v in grads_and_vars if g is not None], global_step=global_step, name=name
        )
        if not variables:
            return applied
        with tf.control_dependencies([applied]):
            # Read after the update: the mean is of the workers' new models.
            current = [v.read_value() for v in variables]
        means = ops.group_all_reduce(current, op="mean", name=f"{self.get_name()}/models")
        if self._alpha == 1.0:
            pulls = [v.assign(m) for v, m in zip(variables, means)]  # exact, as in the Keras form
        else:
            pulls = [v.assign_add(tf.cast(self._alpha, v.dtype.base_dtype) * (m - c))
                     for v, m, c in zip(variables, means, current)]  # fmt: skip
        return tf.group(*pulls, name=name or self.get_name())
