"""What every kungfu_tf wrapper of a ``tf.compat.v1.train.Optimizer`` shares.

The wrapped optimizer keeps its slots, variables and ``compute_gradients``;
a subclass changes ``apply_gradients`` (or ``compute_gradients``) to
synchronise. ``get_slot``, ``get_slot_names`` and ``variables`` reach the
wrapped optimizer, so hooks and checkpoints see its state. Keras 3
variables (``model.trainable_variables`` of a Keras model) are unwrapped to
the ``tf.Variable`` they hold, which a v1 optimizer needs (given the Keras
variable itself it fails with an ``AttributeError`` on a private attribute).

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

import keras
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

    def compute_gradients(
        self, loss: Any, var_list: Any = None, *args: Any, **kwargs: Any
    ) -> list[tuple[Any, tf.Variable]]:
        """The wrapped optimizer's ``(gradient, variable)`` pairs (this worker's own gradients)."""
        if var_list is not None:
            var_list = [as_tf_variable(v) for v in var_list]
        return self._optimizer.compute_gradients(loss, var_list, *args, **kwargs)

    def get_slot(self, var: Any, name: str) -> tf.Variable | None:
        """The wrapped optimizer's slot, e.g. ``get_slot(var, "momentum")``."""
        return self._optimizer.get_slot(as_tf_variable(var), name)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> list[str]:
        """The wrapped optimizer's slot names, e.g. ``["momentum"]``."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self) -> list[tf.Variable]:
        """The wrapped optimizer's variables (slots and e.g. Adam's beta powers)."""
        return self._optimizer.variables()


def as_tf_variable(v: Any) -> Any:
    """The ``tf.Variable`` a Keras 3 variable holds; anything else unchanged.

    Example:
        >>> import keras
        >>> type(as_tf_variable(keras.Variable(1.0))).__name__
        'ResourceVariable'
    """
    if not isinstance(v, keras.Variable):
        return v
    held = v.value  # with the TF backend, the tf.Variable itself (outside autocast)
    if not isinstance(held, tf.Variable):
        raise TypeError(
            f"cannot hand Keras variable {v.path!r} to a tf.compat.v1 optimizer: it holds a "
            f"{type(held).__name__}, not a tf.Variable (Keras backend {keras.backend.backend()!r}?)"
        )
    return held


def unwrap_pairs(grads_and_vars: Any) -> list[tuple[Any, Any]]:
    """``grads_and_vars`` as a list, Keras 3 variables replaced by their ``tf.Variable``."""
    return [(g, as_tf_variable(v)) for g, v in grads_and_vars]


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
