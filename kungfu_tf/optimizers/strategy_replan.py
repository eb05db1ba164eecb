"""Replacing a strategy-driven optimizer's plan: its optimizer slots follow the variables to the new plan.

Two events replace the plan of ``SynchronousSGDOptimizer(opt, strategy=...)``
while training runs: a membership change (kungfu_tf/optimizers/strategy_resize.py:
the strategy re-built for the new cluster) and an explicit switch to another
strategy (kungfu_tf/optimizers/strategy_switch.py). Both move the optimizer
state the same way, here:

1. :func:`gather_slots`: each worker puts the slots of what it updated (as
   the owner of a PS variable or shard, or, for all-reduced variables that
   every worker updates alike, the first worker only) into zero arrays of
   the model variables' shapes, and one sum all-reduce per dtype gives every
   worker every slot of every variable. Adding zeros is exact: the values
   move bit for bit.
2. :func:`install_plan`: the new plan (its consensus checks that every
   worker holds the same strategy bytes), the wrapped optimizer rebuilt on
   the new plan's targets, and each new target's slots cut from the
   gathered ones (a PS owner's slots become every worker's replicas when a
   variable moves to all-reduce, and back; partitioned variables
   re-partition). The plan generation advances: steps traced for the old
   plan refuse to run (kungfu_tf/strategy/plan_generation.py) and
   ``kungfu_tf.elastic.function`` traces them again.

Example (what a switch does, on every worker)::

    kinds, full = gather_slots(opt, opt._kungfu_plan, contributes=True, first=rank == 0, prefix="switch/1")
    install_plan(opt, new_strategy, kinds, full)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective
from kungfu_tf.optimizers.optimizer_step_state import rebuild_keeping_step_state
from kungfu_tf.optimizers.weight_decay_exclusion import decay_parts_as_their_variables
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import plan_generation
from kungfu_tf.strategy.compiler import StrategyPlan
from kungfu_tf.strategy.errors import StrategyError

# Slot tables: slots[kind][i] is the slot of that kind for target i.
SlotTable = list[list[Any]]
# Every slot of every model variable as a full array: full[kind][variable index].
FullSlots = list[list[np.ndarray]]


def slot_table(opt: Any, fixed_ids: set[int], targets: Sequence[Any]) -> SlotTable:
    """The optimizer's slots by kind and target.

    Which target a slot belongs to was recorded when the optimizer made it
    (``_kungfu_slot_targets``: slot id -> target id, by the wrapped class's
    ``add_variable_from_reference``): Keras makes them in no one order (SGD
    kind by kind, Adam target by target: momentum, velocity, momentum, ...).
    The k-th slot made for a target is of kind k.

    Raises:
        StrategyError: a slot of no known target, or targets with different
            numbers of slots: they cannot be moved.
    """
    slots = [v for v in opt.variables if id(v) not in fixed_ids]
    if not targets:
        if slots:
            raise StrategyError(f"{type(opt).__name__} has {len(slots)} slot variables but updates no variable here")
        return []
    owner_of = opt.__dict__.get("_kungfu_slot_targets", {})
    index = {id(t): i for i, t in enumerate(targets)}
    per_target: list[list[Any]] = [[] for _ in targets]
    for slot in slots:
        i = index.get(owner_of.get(id(slot), -1))
        if i is None:
            raise StrategyError(
                f"cannot move the optimizer slots of {type(opt).__name__} to new owners: slot "
                f"{getattr(slot, 'path', slot.name)!r} was not made for a variable this rank updates "
                "(an optimizer that makes slots without add_variable_from_reference)"
            )
        per_target[i].append(slot)
    kinds = {len(s) for s in per_target}
    if len(kinds) != 1:
        raise StrategyError(
            f"cannot move the optimizer slots of {type(opt).__name__} to new owners: its variables have different "
            f"numbers of slots ({sorted(kinds)})"
        )
    table = [[per_target[i][k] for i in range(len(targets))] for k in range(kinds.pop())]
    for row in table:
        for slot, target in zip(row, targets):
            if tuple(slot.shape) != tuple(target.shape) or slot.dtype != target.dtype:
                raise StrategyError(
                    f"cannot move the optimizer slots of {type(opt).__name__} to new owners: slot "
                    f"{getattr(slot, 'path', slot.name)!r} is {slot.dtype} {tuple(slot.shape)}, its variable "
                    f"{getattr(target, 'path', target.name)!r} {target.dtype} {tuple(target.shape)}"
                )
    return table


# Encodes "fewest slot kinds" in a max all-reduce (max of SPREAD - n is SPREAD - min n).
_SPREAD = 1 << 16


def agreed_slot_table(
    opt: Any, targets: Sequence[Any] | None, name: str, extra: Sequence[int] = ()
) -> tuple[SlotTable, int, list[int]]:
    """:func:`slot_table` for ``targets`` on every worker, agreed in one collective: (this worker's table, the
    slot kinds of the workers that have any, the maximum over the workers of each of ``extra``).

    ``targets``: None where this worker contributes no slots (a joiner's
    warm-up made its own). A refusal on some workers only (slots that cannot
    be told apart by variable) or workers with different numbers of slots
    per variable (Keras's Muon: one for matrices, two for the rest; a rank
    that owns only matrices and one that owns only biases each look
    consistent alone) would raise on some and leave the others waiting in
    the next collective: every worker raises the same StrategyError instead.

    Raises:
        StrategyError: on every worker.
    """
    refused, table = "", []
    if targets is not None:
        try:
            table = slot_table(opt, opt._kungfu_fixed_variable_ids, targets)
        except StrategyError as e:
            refused = str(e)
    counts = len(table), _SPREAD - len(table) if targets and not refused else 0, int(bool(refused))
    with tf.init_scope():  # the optimizer may be built while a step is traced
        agreed = collective.all_reduce(tf.constant([*counts, *extra], tf.int32), op="max", name=name,
                                       topology="STAR").numpy().tolist()  # fmt: skip
    most, fewest = agreed[0], _SPREAD - agreed[1] if agreed[1] else agreed[0]
    if agreed[2] or fewest != most:
        reason = refused or ("another worker's cannot move" if agreed[2] else
                             f"its variables have {fewest} slots on some workers and {most} on others")  # fmt: skip
        if not reason.startswith("cannot move"):
            reason = f"cannot move the optimizer slots of {type(opt).__name__} to new owners: {reason}"
        raise StrategyError(reason)
    return table, most, agreed[3:]


def _region(node: Any, target: Any, variable: Any) -> tuple[slice, ...]:
    """Where ``target`` (the variable itself, or one shard of it) lies in ``variable``."""
    if target is variable or node.bounds is None:
        return tuple(slice(None) for _ in variable.shape)
    region = [slice(None)] * len(variable.shape)
    region[node.axis] = slice(*node.bounds)
    return tuple(region)


def _numpy_dtype(variable: Any) -> Any:
    return variable.dtype.as_numpy_dtype if hasattr(variable.dtype, "as_numpy_dtype") else variable.dtype


# Above this size a one-off all-reduce runs on RING, below it on STAR (as
# AUTO's size rule does across hosts).
_ONE_OFF_RING_BYTES = 64 << 10


def one_off_topology(nbytes: int) -> str:
    """The fixed topology of an all-reduce that runs once (a switch's or a resize's slot gather).

    On the runtime's AUTO topology the first all-reduce of a size class on a
    layout probes every candidate: a switch whose slots made a new class
    waited 32 s for it under load (make bench-strategy-policy) where the
    gather itself takes about a second. Every worker passes the same sizes,
    hence the same topology.

    Example:
        >>> one_off_topology(4), one_off_topology(8 << 20)
        ('STAR', 'RING')
    """
    return "RING" if nbytes > _ONE_OFF_RING_BYTES else "STAR"


def _unit_region(node: Any, variable: Any) -> tuple[slice, ...]:
    """Where a unit (a whole variable or one shard, by its node) lies in ``variable``."""
    region = [slice(None)] * len(variable.shape)
    if node.is_shard:
        region[node.axis] = slice(*node.bounds)
    return tuple(region)


def _sum_slots(
    old: StrategyPlan, table: SlotTable, kinds: int, variables: list[Any], contributes: bool,
    first: bool, prefix: str, lost_owners: frozenset[int] = frozenset(),
) -> FullSlots:  # fmt: skip
    """Every slot of every model variable, as full arrays (kind × variable), on every worker (module docstring).

    The slots of a unit whose owner (a rank of ``old``) is in ``lost_owners``
    come from the first worker's replica of them, if the plan kept replicas.
    """
    full = [[np.zeros(v.shape, _numpy_dtype(v)) for v in variables] for _ in range(kinds)]
    if contributes and table:
        index = {id(t): i for i, t in enumerate(old.targets)}
        for vi, node, target in old.placements():
            if target is None or (node.kind != "ps" and not first):
                continue
            region = _region(node, target, variables[vi])
            for k in range(kinds):
                full[k][vi][region] = table[k][index[id(target)]].numpy()
    if contributes and first and kinds:
        nodes = {(vi, ui): unit.node for vi, ui, unit in old.replicable_units()}
        for (vi, ui), replicas in old.slot_replicas.items():
            node = nodes[(vi, ui)]
            if node.owner in lost_owners and len(replicas) == kinds:
                region = _unit_region(node, variables[vi])
                for k in range(kinds):
                    full[k][vi][region] = replicas[k].numpy()
    by_dtype: dict[np.dtype, list[tuple[int, int]]] = {}
    for k in range(kinds):
        for vi in range(len(variables)):
            by_dtype.setdefault(full[k][vi].dtype, []).append((k, vi))
    for n, (dtype, keys) in enumerate(sorted(by_dtype.items(), key=lambda kv: str(kv[0]))):
        flat = np.concatenate([full[k][vi].reshape(-1) for k, vi in keys])
        summed = collective.all_reduce(
            tf.constant(flat), op="sum", name=f"{prefix}/slots/{n}", topology=one_off_topology(flat.nbytes)
        ).numpy()
        offset = 0
        for k, vi in keys:
            size = full[k][vi].size
            full[k][vi] = summed[offset : offset + size].reshape(full[k][vi].shape).astype(dtype)
            offset += size
    return full


def gather_slots(
    opt: Any, old: StrategyPlan, contributes: bool, first: bool, prefix: str, lost_owners: frozenset[int] = frozenset()
) -> tuple[int, FullSlots]:
    """``(slot kinds, full slots)``: every slot of every model variable on every worker (collective).

    ``contributes``: this worker holds slots of ``old`` (a joiner, whose plan
    was its warm-up's, does not); ``first``: it is the first such worker (it
    gives the slots of the all-reduced variables, which every worker holds
    alike, and the replicas of the slots whose owners, ranks of ``old`` in
    ``lost_owners``, crashed).
    """
    variables = list(opt._kungfu_model_variables)
    replica_kinds = len(next(iter(old.slot_replicas.values()), [])) if contributes else 0
    table, most, [most_replicas] = agreed_slot_table(opt, old.targets if contributes else None, f"{prefix}/kinds",
                                                     [replica_kinds])  # fmt: skip
    kinds = max(most, most_replicas)
    full = _sum_slots(old, table, kinds, variables, contributes, first, prefix, lost_owners) if kinds else []
    return kinds, full


def keep_slot_replicas(opt: Any, full: FullSlots | None = None, kinds: int | None = None) -> None:
    """In an elastic job, ``opt``'s plan keeps every parameter-server unit's optimizer slots on every rank
    (:meth:`StrategyPlan.keep_slot_replicas`), so that a crashed owner's slots survive.

    ``full``: the slots the plan starts with (after a re-plan), None for a
    fresh optimizer (the replicas start as the owners' slots); ``kinds``:
    the slot kinds, agreed (after a re-plan); None: agreed here. Either way,
    when the plan has parameter servers, one collective that every worker
    reaches when it builds the optimizer (:func:`agreed_slot_table`) agrees
    on two things: ``KUNGFU_SLOT_REPLICAS=0`` on any worker turns the
    replicas off on all (a crashed owner's slots then restart at zero), and
    an optimizer whose slots cannot follow their variables to new owners
    (Adafactor's factored moments, not of the variables' shapes; Muon's one
    slot for matrices and two for the rest) is refused on every worker now,
    before it trains, rather than failing every worker at the first
    membership change (a rank that owns no variable cannot tell: alone, the
    owners would have raised and the others waited). Nothing to keep: an
    all-reduce plan, a joiner's warm-up plan, an optimizer without slots
    (plain SGD).

    Raises:
        StrategyError: on every worker, the optimizer's slots cannot move.
    """
    import os

    from kungfu_tf.ops import elastic_membership as em
    from kungfu_tf.run.worker_env.worker_env import read_slot_replicas

    plan: StrategyPlan = opt._kungfu_plan
    if not em.is_elastic() or opt._kungfu_warm_up_plan or plan.replicated:
        return  # the same on every rank that reaches here (a function of the strategy): no collective
    off = not read_slot_replicas(os.environ)
    try:
        table, most, [off_somewhere] = agreed_slot_table(opt, plan.targets, f"{plan.name}/slot_replicas", [int(off)])
    except StrategyError as e:
        raise StrategyError(
            f"{type(opt).__name__} cannot train with parameter servers in an elastic job: its optimizer slots must "
            f"follow their variables to new owners at a membership change, and they cannot ({e}); use an all-reduce "
            "strategy (AllReduce, PartitionedAR) or an optimizer with one slot of its variable's shape and dtype per "
            "kind for every variable (SGD, Adam, RMSprop, ...)"
        ) from e
    kinds = most if kinds is None else kinds
    if off_somewhere or not kinds or not plan.replicable_units():
        return
    slots_of = {id(t): [table[k][i] for k in range(kinds)] for i, t in enumerate(plan.targets)} if table else {}
    variables = list(opt._kungfu_model_variables)

    def initial(vi: int, node: Any) -> list[np.ndarray]:
        assert full is not None
        return [full[k][vi][_unit_region(node, variables[vi])] for k in range(kinds)]

    plan.keep_slot_replicas(slots_of, kinds, initial if full is not None else None)


def install_plan(opt: Any, strategy: strategy_pb2.Strategy, kinds: int, full: FullSlots) -> int:
    """Replaces ``opt``'s plan by one for ``strategy``, its slots cut from ``full``; returns the new plan generation.

    Collective (the plan's consensus on the strategy bytes). The wrapped
    optimizer is rebuilt with ``opt._kungfu_build_base`` and the plan's shard
    variables made with ``opt._kungfu_make_variable`` (set when it was built).
    """
    old: StrategyPlan = opt._kungfu_plan
    variables = list(opt._kungfu_model_variables)
    fixed = opt._kungfu_fixed_variable_ids
    plan = StrategyPlan(strategy, variables, name=old.name, make_variable=opt._kungfu_make_variable)
    for slot in [v for v in opt.variables if id(v) not in fixed]:  # a joiner's too (made by its warm-up)
        opt._untrack_variable(slot)
    opt._trainable_variables_indices = {}
    opt.__dict__["_kungfu_slot_targets"] = {}
    opt.built = False
    object.__setattr__(opt, "_kungfu_plan", plan)
    object.__setattr__(opt, "_kungfu_warm_up_plan", False)
    decay_parts_as_their_variables(opt, [(variables[vi], t) for vi, _, t in plan.placements() if t is not None])
    rebuild_keeping_step_state(opt, lambda: opt._kungfu_build_base(plan.targets))
    new_table, most, _ = agreed_slot_table(opt, plan.targets, f"{plan.name}/install_slots")
    if most and most != kinds:  # the same on every worker
        raise StrategyError(f"{type(opt).__name__} has {most} slots per variable under the new plan, {kinds} before")
    index = {id(t): i for i, t in enumerate(plan.targets)}
    for vi, node, target in plan.placements():
        if target is None:
            continue
        region = _region(node, target, variables[vi])
        for k in range(len(new_table)):
            new_table[k][index[id(target)]].assign(full[k][vi][region])
    if kinds:
        keep_slot_replicas(opt, full, kinds)
    return plan_generation.advance()


def finalize_moving_averages(opt: Any, var_list: Sequence[Any]) -> None:
    """Keras's ``finalize_variable_values`` for an optimizer with ``use_ema=True`` under parameter servers:
    every worker's model variables in ``var_list`` take their moving averages (collective, eager).

    Keras's ``fit`` calls it when training ends. The averages are slots, so a
    parameter server's exist on its owner alone: Keras's own version paired
    the model variables with the owner's averages of its own variables (a
    shape mismatch on some workers, another variable's average on others).
    Here the averages are gathered as a membership change gathers slots
    (:func:`gather_slots`), and which slot kind holds them is agreed by the
    workers that own variables.

    Raises:
        ValueError: a variable of ``var_list`` is not one the optimizer trains (before any collective: the
            same list on every worker, as ``fit`` passes it).
        StrategyError: on every worker, the slots cannot be gathered (an optimizer whose slots cannot move,
            e.g. Adafactor).
    """
    plan: StrategyPlan = opt._kungfu_plan
    variables = list(opt._kungfu_model_variables)
    index = {id(v): vi for vi, v in enumerate(variables)}
    unknown = [getattr(v, "path", v.name) for v in var_list if id(v) not in index]
    if unknown:
        raise ValueError(f"finalize_variable_values: {unknown} are not variables this optimizer trains")
    targets = plan.targets or None
    kind = -1  # which slot kind holds the averages: known where this worker owns something
    if targets:
        with contextlib.suppress(StrategyError):  # raised on every worker by the agreement below
            table = slot_table(opt, opt._kungfu_fixed_variable_ids, targets)
            first = opt._model_variables_moving_average[opt._get_variable_index(targets[0])]
            kind = next((k for k, row in enumerate(table) if row[0] is first), -1)
    _, _, [known] = agreed_slot_table(opt, targets, f"{plan.name}/finalize_ema/kinds", [kind + 1])
    if not known:
        raise StrategyError(f"{type(opt).__name__}: no worker found the moving averages among its optimizer slots")
    _, full = gather_slots(opt, plan, contributes=True, first=plan.rank == 0, prefix=f"{plan.name}/finalize_ema")
    for v in var_list:
        v.assign(full[known - 1][index[id(v)]])
