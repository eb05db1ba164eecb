"""Building a Keras 3 optimizer before its first step, with the variable names that step would give.

Keras's ``apply`` builds an unbuilt optimizer inside ``name_scope(optimizer.name)``; a bare
``optimizer.build(...)`` does not. For most optimizers the names come out the same, but an
optimizer that builds another inside its own build gets other names: a ``LossScaleOptimizer``
built by its first step names its inner optimizer's slots ``loss_scale_optimizer/sgd/...``,
built bare ``sgd/...``. Whoever builds an optimizer ahead of the step (the elastic state, the
broadcast callback) builds it here, so that a worker whose step built it (a joiner's warm-up)
holds variables of the same names (a job's model signature compares them).

Example:
    >>> import keras
    >>> sgd = keras.optimizers.SGD(0.1, momentum=0.9, name="sgd")  # named: default names count up
    >>> opt = keras.mixed_precision.LossScaleOptimizer(sgd, name="loss_scale_optimizer")
    >>> build_as_apply_would(opt, [keras.Variable([1.0, 2.0], name="w")])
    >>> [v.path for v in opt.variables][-1]
    'loss_scale_optimizer/sgd/w_momentum'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras


def build_as_apply_would(optimizer: keras.optimizers.Optimizer, variables: Sequence[Any]) -> None:
    """Builds ``optimizer`` for ``variables`` as its ``apply`` builds it in the first step (no-op if built)."""
    if optimizer.built:
        return
    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(list(variables))
    optimizer.built = True


__all__ = ["build_as_apply_would"]
