"""Synchronous SGD for ``tf.compat.v1.train.Optimizer``: average gradients, then apply.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers.sync_sgd_v1 import SynchronousSGDOptimizerV1
    >>> opt = SynchronousSGDOptimizerV1(tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
    >>> opt.get_name()
    'kungfu_sync_sgd'
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kungfu_tf.optimizers.gradient_sync import (
    DEFAULT_FUSION_THRESHOLD_BYTES,
    average_gradients,
)
from kungfu_tf.optimizers.v1_wrapper import WrappedOptimizerV1

DEFAULT_NAME = "kungfu_sync_sgd"


class SynchronousSGDOptimizerV1(WrappedOptimizerV1):
    """Wraps a v1 optimizer so that gradients are averaged over all workers.

    Averaging happens in :meth:`compute_gradients` (as in Horovod), so
    ``minimize`` and ``compute_gradients`` + ``apply_gradients`` both
    synchronise; ``apply_gradients``, slots and variables are the wrapped
    optimizer's own.

    Args:
        optimizer: the ``tf.compat.v1.train.Optimizer`` to wrap.
        fusion_threshold_bytes: bucket size for fused all-reduces (0: no fusion).
        sparse_as_dense: all-reduce ``tf.IndexedSlices`` as dense tensors.
        name: optimizer name, also the prefix of the collectives' message keys.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
        >>> with tf.Graph().as_default():
        ...     w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
        ...     loss = tf.reduce_sum(w * w)
        ...     opt = SynchronousSGDOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        ...     train_op = opt.minimize(loss)
    """

    def __init__(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD_BYTES,
        sparse_as_dense: bool = False,
        name: str | None = None,
        strategy: Any = None,
    ) -> None:
        super().__init__(optimizer, name or DEFAULT_NAME)
        self._fusion_threshold_bytes = fusion_threshold_bytes
        self._sparse_as_dense = sparse_as_dense
        # With a strategy, synchronisation happens in apply_gradients (a PS
        # owner applies, then sends the value); the plan is made there.
        self._strategy = strategy
        self._plan: Any = None

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        """The wrapped optimizer's ``(gradient, variable)`` pairs, gradients averaged over workers.

        Example:
            >>> # grads_and_vars = opt.compute_gradients(loss)   # already averaged
        """
        grads_and_vars = self._optimizer.compute_gradients(*args, **kwargs)
        if not grads_and_vars or self._strategy is not None:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        averaged = average_gradients(
            grads, self._fusion_threshold_bytes, self._sparse_as_dense, name=self.get_name()
        )
        return list(zip(averaged, variables))

    def apply_gradients(
        self, grads_and_vars: Any, global_step: tf.Variable | None = None, name: str | None = None
    ) -> tf.Operation:
        """Delegates to the wrapped optimizer (the gradients are already averaged).

        With a strategy, this is where the gradients are synchronised: the
        wrapped optimizer applies only what this rank updates, and owners
        then send their variables' new values.

        Example:
            >>> # train_op = opt.apply_gradients(opt.compute_gradients(loss), global_step)
        """
        if self._strategy is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        if self._plan is None:
            from kungfu_tf.optimizers.strategy_sync import make_plan

            self._plan = make_plan(self._strategy, variables, self.get_name())

        def apply_fn(gs: list[Any], vs: list[Any]) -> Any:
            if vs:
                return self._optimizer.apply_gradients(list(zip(gs, vs)), global_step=global_step, name=name)
            return global_step.assign_add(1) if global_step is not None else tf.no_op()

        return self._plan.step([g for g, _ in grads_and_vars], apply_fn)
