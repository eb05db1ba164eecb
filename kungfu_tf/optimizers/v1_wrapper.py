"""What every kungfu_tf wrapper of a ``tf.compat.v1.train.Optimizer`` shares.

The wrapped optimizer keeps its slots, variables and ``compute_gradients``;
a subclass changes ``apply_gradients`` (or ``compute_gradients``) to
synchronise. ``get_slot``, ``get_slot_names`` and ``variables`` reach the
wrapped optimizer, so hooks and checkpoints see its state.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers.v1_wrapper import WrappedOptimizerV1
    >>> class Plain(WrappedOptimizerV1):
    ...     def apply_gradients(self, grads_and_vars, global_step=None, name=None):
    ...         return self._optimizer.apply_gradients(grads_and_vars, global_step, name)
    >>> Plain(tf.compat.v1.train.GradientDescentOptimizer(0.1), "plain").get_name()
    'plain'
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class WrappedOptimizerV1(tf.compat.v1.train.Optimizer):
    """A ``tf.compat.v1.train.Optimizer`` that delegates to the one it wraps.

    Args:
        optimizer: the ``tf.compat.v1.train.Optimizer`` to wrap.
        name: optimizer name, also the prefix of the collectives' message keys.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.optimizers import SynchronousSGDOptimizerV1
        >>> issubclass(SynchronousSGDOptimizerV1, WrappedOptimizerV1)
        True
    """

    _kungfu_wrapped = True

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: str) -> None:
        # use_locking only matters to _apply_dense & co., which the wrapped
        # optimizer implements; ours are never called.
        super().__init__(use_locking=False, name=name)
        self._optimizer = optimizer

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, tf.Variable]]:
        """The wrapped optimizer's ``(gradient, variable)`` pairs."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> tf.Variable | None:
        """The wrapped optimizer's slot, e.g. ``get_slot(var, "momentum")``."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> list[str]:
        """The wrapped optimizer's slot names, e.g. ``["momentum"]``."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self) -> list[tf.Variable]:
        """The wrapped optimizer's variables (slots and e.g. Adam's beta powers)."""
        return self._optimizer.variables()


def local_counter(name: str) -> tf.Variable:
    """An int64 step counter in LOCAL_VARIABLES: per worker, not broadcast, not checkpointed.

    ``MonitoredTrainingSession`` initialises local variables with its
    ``local_init_op``.
    """
    return tf.compat.v1.Variable(
        0,
        dtype=tf.int64,
        trainable=False,
        name=name,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
    )
