"""Asynchronous pair averaging (AD-PSGD) for ``tf.compat.v1.train.Optimizer``.

The v1 form of :func:`kungfu_tf.optimizers.PairAveragingOptimizer`. Each
run of the train op saves this worker's model in its p2p store, averages
with the latest model a random other worker saved, and then applies this
worker's own gradients with the wrapped optimizer.

The first run also waits on a barrier after its save, so that every
worker's store holds a model before anybody requests one. The Keras form
does this when the optimizer is built; a v1 graph has no run before the
first step, so the first step does it, guarded by a local step counter.
All workers must therefore run the train op (they do when they all train),
and the model should hold its starting weights by then: use
:class:`kungfu_tf.v1.BroadcastGlobalVariablesHook`.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers.pair_averaging_v1 import PairAveragingOptimizerV1
    >>> PairAveragingOptimizerV1(tf.compat.v1.train.GradientDescentOptimizer(0.1)).get_name()
    'kungfu_pair_averaging'
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from kungfu_tf import ops
from kungfu_tf.optimizers._pair_averaging_parts import (
    DEFAULT_NAME,
    assign_flat,
    flat,
    random_peer,
)
from kungfu_tf.optimizers.v1_wrapper import WrappedOptimizerV1, local_counter


class PairAveragingOptimizerV1(WrappedOptimizerV1):
    """Average with a random peer's saved model, then apply this worker's gradients.

    Args:
        optimizer: the ``tf.compat.v1.train.Optimizer`` to wrap; the
            variables it trains must share one dtype.
        name: optimizer name, the saved model's name in the p2p store and
            the barrier's key prefix.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.optimizers import PairAveragingOptimizer
        >>> with tf.Graph().as_default():
        ...     w = tf.compat.v1.get_variable("w", initializer=[1.0, 2.0])
        ...     opt = PairAveragingOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        ...     train_op = opt.minimize(tf.reduce_sum(w * w))
    """

    _kungfu_wrapper = "PairAveragingOptimizer"

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, name: str | None = None) -> None:
        super().__init__(optimizer, name or DEFAULT_NAME)

    def apply_gradients(
        self, grads_and_vars: Any, global_step: tf.Variable | None = None, name: str | None = None
    ) -> tf.Operation:
        """Save, request, average, then the wrapped optimizer's update (see the module docstring)."""
        grads_and_vars = list(grads_and_vars)
        variables = [v for _, v in grads_and_vars]
        if not variables:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        dtypes = {v.dtype.base_dtype for v in variables}
        if len(dtypes) > 1:
            raise ValueError(f"PairAveragingOptimizer needs variables of one dtype, got {sorted(d.name for d in dtypes)}")
        key = self.get_name()
        steps = local_counter(f"{key}_steps")
        mine = flat([v.read_value() for v in variables])
        save = ops.save(key, mine)

        def first_run() -> tf.Tensor:
            with tf.control_dependencies([ops.barrier(name=f"{key}/saved")]):
                return tf.constant(True)

        with tf.control_dependencies([save]):
            # Only the first run waits for every peer's first save.
            ready = tf.cond(tf.equal(steps.read_value(), 0), first_run, lambda: tf.constant(True))
        with tf.control_dependencies([ready]):
            theirs = ops.request(random_peer(), key, like=mine)
        with tf.control_dependencies(assign_flat(variables, (mine + theirs) / 2)):
            applied = self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        with tf.control_dependencies([applied]):
            return steps.assign_add(1).op
