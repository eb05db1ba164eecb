"""``VariableAccess``: how a runner reads and assigns the variables the traced step reads.

The runner is framework-free; it changes training only through the
variables the step already reads (no re-trace): the per-worker batch size
(read by :func:`kungfu_tf.data.adaptive_batch` and by the monitor), the
learning rate (the optimizer's variable) and the monitor's statistics.
:class:`EagerVariableAccess` does it eagerly (Keras ``fit`` and
``tf.function`` loops); the v1 ``PolicyHook`` has a ``Session`` one.

Example:
    >>> from kungfu_tf.policy.variable_access import EagerVariableAccess
    >>> access = EagerVariableAccess(local_batch_size=32)
    >>> access.assign_local_batch_size(16); int(access.local_batch_size.numpy())
    16
"""

from __future__ import annotations

from typing import Any, Protocol

import tensorflow as tf

from kungfu_tf.policy.policy_state import PolicyState


class VariableAccess(Protocol):
    """What a :class:`~kungfu_tf.policy.PolicyRunner` needs from the training program."""

    local_batch_size: Any
    monitor: Any
    state: Any  # a PolicyState (or one with the same read/write, as the v1 hook's)

    def has_learning_rate(self) -> bool: ...
    def learning_rate_error(self) -> str | None: ...
    def read_learning_rate(self) -> float: ...
    def assign_learning_rate(self, value: float) -> None: ...
    def assign_local_batch_size(self, value: int) -> None: ...
    def read_monitor(self) -> dict[str, Any]: ...
    def read_monitor_local_batch_size(self) -> int: ...


def unwrapped_optimizer(optimizer: Any) -> Any:
    """The optimizer that owns the learning rate and the monitor: wrappers peeled off.

    Keras's ``LossScaleOptimizer`` (which ``compile`` adds under the
    ``mixed_float16`` policy) has a learning-rate variable of its own that
    nothing reads, and the ``kungfu_monitor`` is on the optimizer it wraps;
    both live on the ``inner_optimizer``, wrapped any number of times.
    """
    seen = set()
    while optimizer is not None and getattr(optimizer, "inner_optimizer", None) is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        optimizer = optimizer.inner_optimizer
    return optimizer


def learning_rate_variable(optimizer: Any) -> Any:
    """The variable behind ``optimizer``'s learning rate (wrappers peeled off); ValueError if it is a schedule or missing."""
    if optimizer is None:
        return None
    inner = unwrapped_optimizer(optimizer)
    variable = getattr(inner, "_learning_rate", None)  # Keras 3 keeps it here
    if variable is None or not hasattr(variable, "assign"):
        raise ValueError(
            f"the optimizer {type(inner).__name__}'s learning rate must be a variable (a number when "
            f"compiled), not a LearningRateSchedule or a callable, got {variable!r}: use lr_rule=None and "
            "no set_learning_rate, or a constant learning rate"
        )
    return variable


class EagerVariableAccess:
    """Eager reads and assignments; the runner's ``local_batch_size`` variable lives here.

    ``optimizer``: a Keras 3 optimizer whose ``learning_rate`` is adapted;
    ``learning_rate``: a ``tf.Variable`` to adapt instead (custom loops);
    ``monitor``: a ``GradientMonitor`` (``values()``, ``local_batch_size``).
    """

    def __init__(self, local_batch_size: int = 0, optimizer: Any = None, learning_rate: Any = None, monitor: Any = None):
        with tf.init_scope():
            self.local_batch_size = tf.Variable(int(local_batch_size), dtype=tf.int64, trainable=False,
                                                name="kungfu_local_batch_size")  # fmt: skip
        self.state = PolicyState()
        self.monitor = monitor
        self._lr = learning_rate
        self._optimizer: Any = None
        self.bind(optimizer=optimizer, monitor=monitor)

    def bind(self, optimizer: Any = None, monitor: Any = None) -> None:
        """Adopts ``optimizer`` (its learning rate unless one was given, found when first needed) and its ``kungfu_monitor``."""
        if optimizer is not None:
            self._optimizer = optimizer
        if monitor is not None:
            self.monitor = monitor
        elif self.monitor is None and optimizer is not None:  # an explicit monitor= wins
            self.monitor = getattr(unwrapped_optimizer(optimizer), "kungfu_monitor", None)

    def _learning_rate(self) -> Any:
        # Resolved when needed: an optimizer with a LearningRateSchedule is
        # fine as long as nothing sets its learning rate.
        if self._lr is None and self._optimizer is not None:
            self._lr = learning_rate_variable(self._optimizer)
        return self._lr

    def has_learning_rate(self) -> bool:
        return self._lr is not None or self._optimizer is not None

    def learning_rate_error(self) -> str | None:
        """Why the learning rate cannot be set (e.g. the optimizer's is a schedule), or None."""
        try:
            self._learning_rate()
        except ValueError as e:
            return str(e)
        return None

    def read_learning_rate(self) -> float:
        with tf.init_scope():
            return float(self._learning_rate().numpy())

    def assign_learning_rate(self, value: float) -> None:
        with tf.init_scope():
            self._learning_rate().assign(value)

    def assign_local_batch_size(self, value: int) -> None:
        with tf.init_scope():
            self.local_batch_size.assign(value)
            if self.monitor is not None and getattr(self.monitor, "local_batch_size", None) is not None:
                self.monitor.local_batch_size.assign(value)

    def read_monitor_local_batch_size(self) -> int:
        """The monitor's per-worker batch size (0 without a monitor or without the variable)."""
        variable = getattr(self.monitor, "local_batch_size", None)
        if variable is None:
            return 0
        with tf.init_scope():
            return int(variable.numpy())

    def read_monitor(self) -> dict[str, Any]:
        if self.monitor is None:
            return {}
        with tf.init_scope():
            return dict(self.monitor.values())

