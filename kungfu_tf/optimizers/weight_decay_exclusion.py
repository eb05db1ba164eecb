"""Keras's ``exclude_from_weight_decay`` kept through the wrappers and applied to the plan's shard variables.

``opt.exclude_from_weight_decay(var_list=..., var_names=...)`` (AdamW, Lion,
... with ``weight_decay``: biases and LayerNorm scales usually excluded) is
not part of ``get_config``: the wrappers, which rebuild the optimizer from its
config, dropped it, and every variable was decayed. And a parameter server's
shard of a partitioned variable is a variable of its own, which an exclusion
by variable (``var_list``) did not name.

Example::

    inner = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
    inner.exclude_from_weight_decay(var_names=["bias", "LayerNorm"])
    opt = SynchronousSGDOptimizer(inner)        # copy_exclusions(inner, copy) keeps them
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import keras


def copy_exclusions(source: Any, copy: Any) -> None:
    """``copy`` (rebuilt from ``source``'s config) excludes from weight decay what ``source`` excludes."""
    ids = getattr(source, "_exclude_from_weight_decay", None)
    pattern = getattr(source, "_exclude_from_weight_decay_pattern", None)
    if ids is None and pattern is None:
        return
    copy._exclude_from_weight_decay = set(ids or ())
    copy._exclude_from_weight_decay_pattern = pattern
    copy._exclude_from_weight_decay_cache = {}


def decay_parts_as_their_variables(opt: Any, parts: Iterable[tuple[Any, Any]]) -> None:
    """For each ``(model variable, variable standing for a part of it)``: the part is decayed exactly where its
    model variable is, by variable and by name alike. A shard's own name (``kernel_part_0_shard``, made from
    the variable's path) would answer a name pattern otherwise: ``shard`` or a layer's name would exclude
    shards of variables that one process decays."""
    if not hasattr(opt, "_use_weight_decay"):
        return
    for variable, part in parts:
        if part is not variable:
            # Asked as Keras's TF backend asks in apply: of the tf.Variable (its name ends in ":0").
            inner = variable.value if isinstance(variable, keras.Variable) else variable
            opt._exclude_from_weight_decay_cache[opt._var_key(part)] = opt._use_weight_decay(inner)
