"""Refusing a synchronous optimizer inside a Keras ``LossScaleOptimizer``, and one around it under parameter servers.

Keras's ``Model.compile`` wraps the optimizer in a ``LossScaleOptimizer``
when the model's dtype policy is ``mixed_float16`` (``auto_scale_loss``).
That wrapper checks whether *this worker's* gradients are finite and calls
the inner optimizer's ``apply`` only if they are. Inside it, a
``SynchronousSGDOptimizer``'s all-reduce runs on the workers whose own
gradients were finite and not on the one that overflowed: the workers'
collectives pair with the wrong steps (one worker's step 1 averaged with
another's step 2), their loss scales drift apart, and the job ends in a
hang or a lost peer. The other way round,
``SynchronousSGDOptimizer(LossScaleOptimizer(opt))`` averages the scaled
gradients first and every worker decides on the same average; ``compile``
then adds no wrapper of its own (the optimizer already is one).

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    >>> isinstance(opt, keras.optimizers.LossScaleOptimizer)  # compile() under mixed_float16 keeps it as it is
    True
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import keras

# How far up the stack the wrapper's call may be: LossScaleOptimizer._stateful_handle_finite_grads calls
# inner_optimizer.apply directly; a few frames more leave room for Keras's own decorators.
_FRAMES = 4


def refuse_inside_loss_scale(opt: Any, wrapper: str) -> None:
    """``ValueError`` if ``opt.build`` or ``opt.apply`` was called by a ``LossScaleOptimizer`` that wraps ``opt``.

    Called from both: the wrapper calls ``apply`` only where the worker's
    gradients are finite (in an eager step, where Keras's ``cond`` runs one
    branch, a worker that overflowed would not get here), but it builds its
    inner optimizer on every worker before the first step. Every worker
    runs the same code, so every worker raises, before any collective.
    """
    frame = sys._getframe(2)  # the caller of the wrapped optimizer's build or apply
    for _ in range(_FRAMES):
        if frame is None:
            return
        caller = frame.f_locals.get("self")
        if isinstance(caller, keras.optimizers.LossScaleOptimizer) and getattr(caller, "inner_optimizer", None) is opt:
            raise ValueError(
                f"{wrapper} inside a LossScaleOptimizer (Keras's compile() adds one under the mixed_float16 "
                "policy): it applies the step only on the workers whose own gradients are finite, so the "
                "workers' averages would pair with different steps; wrap it the other way round, "
                f"{wrapper}(keras.optimizers.LossScaleOptimizer(opt)), which averages first, and compile() "
                "adds no wrapper of its own"
            )
        frame = frame.f_back


def refuse_loss_scale_with_servers(opt: Any, servers: Sequence[str]) -> None:
    """``StrategyError`` if ``opt`` is a LossScaleOptimizer and a strategy puts ``servers`` on parameter servers.

    A LossScaleOptimizer decides in its ``apply`` whether the step's
    gradients are finite, skips the update and halves its scale if not, and
    grows the scale after enough finite steps. Under parameter servers each
    rank applies only the variables it owns: an owner whose share held an
    inf would skip while the others applied theirs, and a rank that owns
    nothing would never grow its scale; the workers' scales drift apart and
    the averaged gradients mix them. Checked when the optimizer is built and
    before a switch (``switch_strategy``, ``builders.Auto``'s trials); the
    same on every rank (a function of the strategy).
    """
    from kungfu_tf.strategy.errors import StrategyError

    if isinstance(opt, keras.optimizers.LossScaleOptimizer) and servers:
        raise StrategyError(
            "SynchronousSGDOptimizer(LossScaleOptimizer(...), strategy=...) needs every worker to apply every "
            f"variable, but the strategy updates {list(servers)} on parameter servers: each owner would skip steps "
            "and grow its loss scale from its own variables' gradients alone, and the workers' scales would drift "
            "apart; use an all-reduce strategy ('AllReduce', 'PartitionedAR')"
        )


__all__ = ["refuse_inside_loss_scale", "refuse_loss_scale_with_servers"]
