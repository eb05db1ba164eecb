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

from kungfu_tf.optimizers.gradient_monitor import GradientMonitor
from kungfu_tf.optimizers.gradient_sync import (
    DEFAULT_FUSION_THRESHOLD_BYTES,
    average_gradients_with_rider,
)
from kungfu_tf.optimizers.v1_wrapper import WrappedOptimizerV1, unwrap_pairs
from kungfu_tf.strategy.auto.builder import is_auto
from kungfu_tf.strategy.errors import StrategyError

DEFAULT_NAME = "kungfu_sync_sgd"


class SynchronousSGDOptimizerV1(WrappedOptimizerV1):
    """Wraps a v1 optimizer so that gradients are averaged over all workers.

    Averaging happens in :meth:`apply_gradients`, the one method every way of
    training goes through: ``minimize``, ``compute_gradients`` +
    ``apply_gradients``, and a TF2 loop that takes its gradients from a
    ``tf.GradientTape`` and calls ``apply_gradients`` each average exactly
    once. :meth:`compute_gradients` therefore returns this worker's own
    gradients (as KungFu's optimizers do; Horovod's v1 optimizer averages
    there instead, which lets a tape loop train every worker on its own
    gradients without an error). Slots and variables are the wrapped
    optimizer's own. Do not combine with
    :class:`~kungfu_tf.optimizers.DistributedGradientTape`, whose gradients
    are already averaged: use a plain optimizer with it.

    Args:
        optimizer: the ``tf.compat.v1.train.Optimizer`` to wrap.
        fusion_threshold_bytes: bucket size for fused all-reduces (0: no fusion).
        sparse_as_dense: all-reduce ``tf.IndexedSlices`` as dense tensors.
        name: optimizer name, also the prefix of the collectives' message keys.
        strategy: per-variable synchronisation, as for
            :func:`~kungfu_tf.optimizers.SynchronousSGDOptimizer`.
        monitor: a :class:`~kungfu_tf.optimizers.GradientMonitor` updated by
            every ``apply_gradients`` (create it inside the training graph);
            exposed as ``kungfu_monitor`` and tracked for checkpoints.

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
        monitor: GradientMonitor | None = None,
    ) -> None:
        if is_auto(strategy):
            # A v1 graph is built once and run by sessions: nothing hands its steps to the search or re-builds
            # the graph after a switch, and training on the starting strategy instead would be a silent fallback.
            raise StrategyError(
                "builders.Auto searches on the steps of a TF2 training loop (Keras fit with "
                "kungfu_tf.keras.AutoSearchCallback, or a kungfu_tf.elastic.function step); a v1 graph cannot switch "
                "strategy while it runs: search beforehand (kungfu-strategy search) and pass the strategy file it writes"
            )
        super().__init__(optimizer, name or DEFAULT_NAME)
        if monitor is not None and not isinstance(monitor, GradientMonitor):
            raise TypeError(
                f"monitor must be a kungfu_tf.optimizers.GradientMonitor or None, got "
                f"{type(monitor).__module__}.{type(monitor).__qualname__}"
            )
        self.kungfu_monitor = monitor
        if monitor is not None:
            monitor.attach(self)
            # v1 optimizers do not track attributes by themselves.
            self._track_trackable(monitor, "kungfu_monitor")
        self._fusion_threshold_bytes = fusion_threshold_bytes
        self._sparse_as_dense = sparse_as_dense
        # With a strategy, synchronisation happens in apply_gradients (a PS
        # owner applies, then sends the value); the plan is made there.
        self._strategy = strategy
        self._plan: Any = None

    def apply_gradients(
        self, grads_and_vars: Any, global_step: tf.Variable | None = None, name: str | None = None
    ) -> tf.Operation:
        """Averages the gradients over all workers, then the wrapped optimizer applies them.

        Without a strategy the gradients are averaged as
        :func:`~kungfu_tf.optimizers.average_gradients` does (fused
        all-reduce, all-gather for ``tf.IndexedSlices``, ``None`` kept). With
        a strategy, the wrapped optimizer applies only what this rank
        updates, and owners then send their variables' new values.

        Example:
            >>> # train_op = opt.apply_gradients(opt.compute_gradients(loss), global_step)
            >>> # opt.apply_gradients(zip(tape.gradient(loss, variables), variables))  # TF2, eager
        """
        grads_and_vars = unwrap_pairs(grads_and_vars)
        monitor = self.kungfu_monitor
        grads = [g for g, _ in grads_and_vars]
        local = monitor.local_statistics(grads) if monitor is not None and grads else None
        if self._strategy is None:
            observed = None
            if grads_and_vars:
                variables = [v for _, v in grads_and_vars]
                averaged, rider = average_gradients_with_rider(
                    grads,
                    None if local is None else local.rider,
                    self._fusion_threshold_bytes,
                    self._sparse_as_dense,
                    name=self.get_name(),
                )
                if local is not None:
                    observed = monitor.update(local, rider, grads, averaged, self.get_name())
                grads_and_vars = list(zip(averaged, variables))
            applied = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
            if observed is None or tf.executing_eagerly():
                return applied
            return tf.group(applied, observed)
        variables = [v for _, v in grads_and_vars]
        if self._plan is None:
            from kungfu_tf.optimizers.strategy_sync import check_monitorable, make_plan

            self._plan = make_plan(self._strategy, variables, self.get_name())
            if monitor is not None:
                check_monitorable(self._plan)

        def apply_fn(gs: list[Any], vs: list[Any]) -> Any:
            if vs:
                return self._optimizer.apply_gradients(list(zip(gs, vs)), global_step=global_step, name=name)
            return global_step.assign_add(1) if global_step is not None else tf.no_op()

        if local is None:
            return self._plan.step(grads, apply_fn)

        def observe(averaged: list[Any], rider: tf.Tensor) -> Any:
            return monitor.update(local, rider, grads, averaged, self.get_name())

        return self._plan.step(grads, apply_fn, rider=local.rider, observe=observe)
