"""Every worker's copy of a stale or asynchronous parameter server's variables, made its owner's value again.

Under a stale (``staleness = K > 0``) or asynchronous (``sync = false``)
parameter server the owner applies the gradients pushed to it and every
other worker fetches the owner's newest value when its step needs it
(kungfu_tf/strategy/kernels/ps_stale.py): the copies differ between workers
by up to K of the owner's steps, and with ``sync = false`` by any number.
Nothing asks them to agree while training runs, but three moments do:

* a membership change: the elastic state sync checks that every worker
  holds the same state, the new plan slices its shards from the copies, and
  an owner that leaves takes the newest value with it (before: every worker
  failed the sync with ``StateMismatchError``);
* the end of training, before a checkpoint or an evaluation on one worker;
* a strategy switch away from such a plan.

:func:`refresh_stale_copies` gives every worker, for each part of a
variable that a stale parameter server updates, its owner's value, or, if
the owner is gone (a crash), the first surviving member's copy (at most K
steps old; any age without a bound). One sum all-reduce of bytes: each part
comes from one worker, the others add zero bytes, so the values move bit for
bit (a float sum would turn -0.0 into 0.0, and TensorFlow's threads flush
denormals to zero). Each worker gives its parts from the model variables,
which hold the truth between steps: a step cuts each shard an owner updates
from its model variable before it applies (a user's ``set_weights`` or a
restored checkpoint counts), and a shard a failed step updated without
writing it back is cut again when the step is run again.
Gradients pushed to an owner but not yet applied by it are not part of any
value; at a change the next plan's steps no longer take them.

Example (at the end of an asynchronous parameter-server run, on every worker)::

    from kungfu_tf.optimizers import sync_stale_copies
    sync_stale_copies(optimizer)       # every worker now holds the owners' values
    if kungfu_tf.rank() == 0:
        model.save("model.keras")
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective
from kungfu_tf.strategy.compiler import StrategyPlan


def _is_stale(node: Any) -> bool:
    return node.kind == "ps" and (not node.sync or node.staleness > 0)


def _region(node: Any, variable: Any) -> tuple[Any, ...]:
    if not node.is_shard:
        return (Ellipsis,)
    region: list[Any] = [slice(None)] * len(variable.shape)
    region[node.axis] = slice(*node.bounds)
    return tuple(region)


def refresh_stale_copies(
    opt: Any, plan: StrategyPlan | None, first: bool, prefix: str, lost_owners: frozenset[int] = frozenset()
) -> list[int]:
    """Collective: the model variables that ``plan``'s stale parameter servers update become their owners' values
    on every worker; returns their indices (the same on every worker; empty: nothing stale, one all-reduce).

    ``plan``: the plan this worker trained with, None where it holds none (a
    joiner, whose copies the state sync replaces); ``first``: this worker
    gives the parts whose owner (a rank of ``plan``) is in ``lost_owners``,
    and the parts of those variables no parameter server owns.
    """
    variables = list(opt._kungfu_model_variables)
    flags = np.zeros(len(variables), np.int32)
    if plan is not None:
        for vi, node, _ in plan.placements():
            flags[vi] |= int(_is_stale(node))
    with tf.init_scope():
        agreed = collective.all_reduce(tf.constant(flags), op="max", name=f"{prefix}/stale_variables",
                                       topology="STAR").numpy()  # fmt: skip
    stale = [vi for vi in range(len(variables)) if agreed[vi]]
    if not stale:
        return []
    full = {vi: np.zeros(variables[vi].shape, tf.as_dtype(variables[vi].dtype).as_numpy_dtype) for vi in stale}
    if plan is not None:
        for vi, node, _ in plan.placements():
            if vi not in full:
                continue
            owned = node.kind == "ps" and node.owner not in lost_owners
            region = _region(node, variables[vi])
            if (owned and node.owner == plan.rank) or (not owned and first):
                full[vi][region] = np.asarray(variables[vi].numpy())[region]
    flat = np.concatenate([np.ascontiguousarray(full[vi]).reshape(-1).view(np.uint8) for vi in stale])
    with tf.init_scope():
        summed = collective.all_reduce(tf.constant(flat), op="sum", name=f"{prefix}/stale_values",
                                       topology="RING" if flat.nbytes > 64 << 10 else "STAR").numpy()  # fmt: skip
        offset = 0
        for vi in stale:
            size = full[vi].nbytes
            variables[vi].assign(summed[offset : offset + size].view(full[vi].dtype).reshape(full[vi].shape))
            offset += size
    return stale


def sync_stale_copies(optimizer: Any, name: str = "kungfu/strategy/sync_stale_copies") -> list[int]:
    """Every worker's copy of the variables ``optimizer``'s stale or asynchronous parameter servers update becomes
    their owners' value (collective: every worker calls it, eagerly, between steps). Returns their indices among
    the optimizer's variables; nothing to do (a synchronous strategy) costs one small all-reduce.

    Call it where the copies must agree: before one worker saves a
    checkpoint or evaluates, and at the end of training. Membership changes
    and strategy switches do it by themselves.

    Example:
        >>> sync_stale_copies(optimizer)   # doctest: +SKIP
        [0, 1]

    Raises:
        TypeError: ``optimizer`` is not a built ``SynchronousSGDOptimizer`` with a strategy.
    """
    plan = getattr(optimizer, "__dict__", {}).get("_kungfu_plan")
    if plan is None:
        raise TypeError(f"sync_stale_copies: {type(optimizer).__name__} is not a built optimizer with a strategy "
                        "(SynchronousSGDOptimizer(opt, strategy=...), after its first step)")  # fmt: skip
    import kungfu_tf

    return refresh_stale_copies(optimizer, plan, first=kungfu_tf.rank() == 0, prefix=name)
