"""``PairAveragingOptimizer``: asynchronous decentralised model averaging (AD-PSGD) for Keras 3.

KungFu's ``PairAveragingOptimizer``: no collective on the critical path. Each
step, a worker

1. saves its current model (all trainable variables, flattened and
   concatenated into one tensor) in its peer-to-peer store under a fixed
   name (``ops.save``);
2. requests the latest model some other worker saved there
   (``ops.request``); the peer is drawn uniformly among the other ranks;
3. averages with it, ``v ← (v + v_peer) / 2``;
4. applies its *own* gradients with the wrapped optimizer.

The peer does not wait for the request: the model it serves is whatever it
saved last, possibly a few steps old (that staleness is what makes the
algorithm asynchronous). With one worker the "peer" is the worker itself and
averaging leaves the variables unchanged.

Initial save: a request must find a model, so the optimizer's ``build`` (which
Keras calls once, before the first update, in ``model.fit`` and in the first
``apply_gradients``) saves the model and then waits on a barrier until every
worker has saved. Consequences: every worker must build the optimizer (they
do when they all train), and the model should already hold its starting
weights at build time — call ``kungfu_tf.broadcast_variables`` *before*
``fit`` / the first step, or the first requests return pre-broadcast weights.
Optimizer state (momentum, Adam moments) stays local.

Workers that start at different times: until a peer saves its first trained
model, requests return its initial one. A worker that starts its steps early
(for example because it traced its step function faster) therefore keeps
being pulled back towards the starting weights. In long runs this washes out.
In very short runs (tests, or a few hundred steps of a few milliseconds each),
call ``kungfu_tf.ops.barrier()`` after the first step. That is how
``tests/workers/model_averaging.py`` makes np=3 reliable.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import PairAveragingOptimizer
    >>> opt = PairAveragingOptimizer(keras.optimizers.SGD(0.1))
    >>> type(opt).__name__, isinstance(opt, keras.optimizers.SGD)
    ('SGD', True)
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from kungfu_tf import ops
from kungfu_tf.optimizers._pair_averaging_parts import (
    DEFAULT_NAME,
    assign_flat,
    flat,
    random_peer,
)
from kungfu_tf.optimizers._wrapping import (
    V1_TOO,
    check_not_wrapped,
    require_keras,
    wrap_keras,
)
from kungfu_tf.optimizers.keras_build import build_as_apply_would


def _methods(base: type) -> dict[str, Any]:
    def build(self: keras.optimizers.Optimizer, variables: Any) -> None:
        variables = list(variables)
        base.build(self, variables)
        dtypes = {v.dtype for v in variables}
        if len(dtypes) > 1:
            raise ValueError(f"PairAveragingOptimizer needs variables of one dtype, got {sorted(dtypes)}")
        if not variables:
            return
        # init_scope: run the save and the barrier now, once, even when Keras
        # builds the optimizer while tracing the first tf.function step (they
        # must not become part of every step). The barrier makes sure every
        # peer's store holds a model before anybody requests one.
        with tf.init_scope():
            ops.save(self._kungfu_name, flat(variables))
            ops.barrier(name=f"{self._kungfu_name}/saved")

    def apply(self: keras.optimizers.Optimizer, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        if trainable_variables is None:
            variables = list(self._trainable_variables)  # Keras requires a built optimizer here
        else:
            variables = trainable_variables = list(trainable_variables)
            if not self.built:
                # As base.apply would, but before the request: build saves
                # the initial model that the first request relies on.
                build_as_apply_would(self, variables)
        if variables:
            mine = flat(variables)
            save = ops.save(self._kungfu_name, mine)
            # The request must follow this worker's save (explicit: the
            # custom ops touch no resource variables that would order them).
            with tf.control_dependencies([save] if save is not None else []):
                theirs = ops.request(random_peer(), self._kungfu_name, like=mine)
            assign_flat(variables, (mine + theirs) / 2)
        # The update reads the averaged variables (automatic control
        # dependencies order it after the assignments above).
        return base.apply(self, grads, trainable_variables)

    return {"build": build, "apply": apply}


def PairAveragingOptimizer(  # a factory named like the class it returns, as in Horovod
    opt: keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer, name: str | None = None
) -> keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer:
    """Wraps ``opt`` for asynchronous pair averaging: average with a random peer's saved model, then step.

    Each step: save the model, ``v ← (v + v_peer) / 2`` with the latest model
    saved by a peer drawn uniformly among the other workers, then the wrapped
    optimizer applies this worker's own gradients. ``build`` saves the initial
    model and waits until all workers have (see the module docstring).

    Args:
        opt: a Keras 3 optimizer (``keras.optimizers.Optimizer``) or a
            ``tf.compat.v1.train.Optimizer``; the variables it trains must
            all have one dtype.
        name: name of the saved model in the p2p store, also the barrier's
            key prefix (default ``"kungfu_pair_averaging"``); give each
            optimizer of one program its own name.

    Returns:
        A new instance of a subclass of ``opt``'s class, rebuilt from
        ``opt.get_config()``; use it in place of ``opt``. v1: a
        ``PairAveragingOptimizerV1`` delegating to ``opt``
        (see :mod:`kungfu_tf.optimizers.pair_averaging_v1`).

    Raises:
        TypeError: ``opt`` is neither a Keras 3 nor a ``tf.compat.v1.train`` optimizer.
        ValueError: ``opt`` is already wrapped by a kungfu_tf wrapper; at
            build time, variables of more than one dtype.

    Compile with ``jit_compile=False``: the p2p ops have no XLA kernels.

    Example:
        >>> import keras
        >>> import kungfu_tf
        >>> from kungfu_tf.optimizers import PairAveragingOptimizer
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> kungfu_tf.broadcast_variables(model.variables)  # before the optimizer is built
        >>> opt = PairAveragingOptimizer(keras.optimizers.SGD(0.01))
        >>> model.compile(optimizer=opt, loss="mse", jit_compile=False)
    """
    check_not_wrapped(opt)
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        from kungfu_tf.optimizers.pair_averaging_v1 import PairAveragingOptimizerV1

        return PairAveragingOptimizerV1(opt, name)
    opt = require_keras(opt, "PairAveragingOptimizer", V1_TOO)
    return wrap_keras(
        opt,
        _methods,
        f"{type(opt).__name__} averaging its model with a random kungfu_tf peer's every step.",
        "PairAveragingOptimizer",
        _kungfu_name=name or DEFAULT_NAME,
    )
