"""``SynchronousAveragingOptimizer``: synchronous model averaging (SMA) for Keras 3 optimizers.

Every worker applies its *own* gradients with the wrapped optimizer (no
gradient all-reduce); then, in the same step, every variable is pulled toward
the average of all workers' models::

    v_local = update(v, own gradient)              # the wrapped optimizer
    v       = v_local + alpha * (mean_over_workers(v_local) - v_local)

This is KungFu's ``SynchronousAveragingOptimizer`` (the SMA of Crossbow,
"Taming Hyperparameters" §3.1, without the central model's momentum), with
one deliberate difference in *when* the average is taken: KungFu averages the
models *before* the local update and then applies both corrections (the pull
toward the pre-update average plus the local step); here the average is taken
*after* the local update. Consequences of that choice:

* ``alpha=1.0`` leaves every worker with identical weights after every step
  (and, with plain SGD from identical weights, equals S-SGD);
* the pull always uses the newest models, so a worker's gradient is never
  applied on top of an average that no longer contains it;
* the all-reduce cannot overlap the local update (it needs its result).

Optimizer state (momentum, Adam moments) stays local; only trainable
variables are averaged, with one fused ``group_all_reduce(op="mean")`` per
step whose message key is derived from ``name`` (unique per graph, identical
on every worker).

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousAveragingOptimizer
    >>> opt = SynchronousAveragingOptimizer(keras.optimizers.SGD(0.1), alpha=0.1)
    >>> type(opt).__name__, isinstance(opt, keras.optimizers.SGD), opt._kungfu_alpha
    ('SGD', True, 0.1)
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from kungfu_tf import ops
from kungfu_tf.ops.call_names import call_prefix
from kungfu_tf.optimizers._wrapping import (
    V1_TOO,
    check_not_wrapped,
    require_keras,
    wrap_keras,
)
from kungfu_tf.optimizers.loss_scale_guard import refuse_inside_loss_scale
from kungfu_tf.optimizers.sync_averaging_v1 import SynchronousAveragingOptimizerV1

DEFAULT_NAME = "kungfu_sync_averaging"


def _methods(base: type) -> dict[str, Any]:
    def apply(self: keras.optimizers.Optimizer, grads: Any, trainable_variables: Any = None) -> Any:
        # apply() is where Keras 3 sends both model.fit() and apply_gradients().
        refuse_inside_loss_scale(self, "SynchronousAveragingOptimizer")
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        result = base.apply(self, grads, trainable_variables)
        # After base.apply the optimizer is built, so this is the full list
        # even when the caller passed only gradients. All of them are
        # averaged (also those whose gradient was None this step): every
        # worker must pass the same tensors to the collective.
        variables = list(self._trainable_variables) if trainable_variables is None else trainable_variables
        if not variables:
            return result
        alpha = self._kungfu_alpha
        # Reading the variables here sees the local update: in tf.function,
        # automatic control dependencies order reads after earlier writes.
        means = ops.group_all_reduce(
            [tf.convert_to_tensor(v) for v in variables], op="mean", name=f"{call_prefix(self._kungfu_name)}/models"
        )
        for v, mean in zip(variables, means):
            if alpha == 1.0:
                v.assign(mean)  # exact: no rounding in v + 1.0 * (mean - v)
            else:
                v.assign_add(tf.cast(alpha, v.dtype) * (mean - tf.convert_to_tensor(v)))
        return result

    def build(self: keras.optimizers.Optimizer, variables: Any) -> None:
        refuse_inside_loss_scale(self, "SynchronousAveragingOptimizer")  # built on every worker, finite gradients or not
        base.build(self, variables)

    return {"apply": apply, "build": build}


def SynchronousAveragingOptimizer(  # a factory named like the class it returns, as in Horovod
    opt: keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer, alpha: float = 0.1, name: str | None = None
) -> keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer:
    """Wraps ``opt`` for synchronous model averaging: local step, then pull toward the workers' mean.

    Each step: ``v ← update(v, own gradient)``, then
    ``v ← v + alpha·(mean(v) − v)`` where ``mean`` is the all-reduced average
    of the *post-update* variables of all workers (see the module docstring
    for how this differs from KungFu's pre-update average).

    Args:
        opt: a Keras 3 optimizer (``keras.optimizers.Optimizer``) or a
            ``tf.compat.v1.train.Optimizer``.
        alpha: how far each variable moves toward the average, in (0, 1];
            1.0 makes all workers identical after every step.
        name: prefix of the all-reduce's message key (default
            ``"kungfu_sync_averaging"``); give each optimizer of one program
            its own name.

    Returns:
        A new instance of a subclass of ``opt``'s class, rebuilt from
        ``opt.get_config()`` (state copied if ``opt`` was built); use it in
        place of ``opt``. Start all workers from identical weights
        (``kungfu_tf.broadcast_variables``). v1: a
        :class:`SynchronousAveragingOptimizerV1` delegating to ``opt``
        (start from identical weights with
        ``kungfu_tf.v1.BroadcastGlobalVariablesHook``).

    Raises:
        TypeError: ``opt`` is neither a Keras 3 nor a ``tf.compat.v1.train`` optimizer.
        ValueError: ``opt`` is already wrapped by a kungfu_tf wrapper, or
            ``alpha`` is not in (0, 1].

    Compile with ``jit_compile=False``: the collectives have no XLA kernels.

    Example:
        >>> import keras
        >>> import kungfu_tf
        >>> from kungfu_tf.optimizers import SynchronousAveragingOptimizer
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> kungfu_tf.broadcast_variables(model.variables)
        >>> opt = SynchronousAveragingOptimizer(keras.optimizers.SGD(0.01, momentum=0.9), alpha=0.1)
        >>> model.compile(optimizer=opt, loss="mse", jit_compile=False)
    """
    check_not_wrapped(opt)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be a number in (0, 1], got {alpha!r}")
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        return SynchronousAveragingOptimizerV1(opt, alpha, name)
    opt = require_keras(opt, "SynchronousAveragingOptimizer", V1_TOO)
    return wrap_keras(
        opt,
        _methods,
        f"{type(opt).__name__} with its model pulled toward the kungfu_tf workers' average every step.",
        "SynchronousAveragingOptimizer",
        _kungfu_alpha=float(alpha),
        _kungfu_name=name or DEFAULT_NAME,
    )
