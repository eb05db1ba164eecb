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

# Slot tables: slots[kind][i] is the slot of that kind for target i, None where the target has none (Keras's
# Muon: one slot for matrices, two for the rest).
SlotTable = list[list[Any]]
# Every slot of every model variable as a full array: full[kind][variable index] (None: the variable has no slot
# of that kind). A partitioned variable's slots have its shape (each shard's slots are cut from them); a whole
# variable's have their own (Adafactor's factored moments: a matrix's row and column sums).
FullSlots = list[list[np.ndarray | None]]
# A slot's (shape, dtype name) per kind for one variable or unit; None: no slot of that kind.
SlotLayout = list[tuple[tuple[int, ...], str] | None]


# Slot shapes travel as fixed-width codes (agreed_layout), and slots in the runtime's collectives: the dtypes
# it reduces and broadcasts, coded 1.. (0: no slot).
_MAX_RANK = 8
_DTYPES = ("float16", "bfloat16", "float32", "float64", "uint8", "int32", "int64")


def _listed_targets(opt: Any, slot_ids: set[int], n: int) -> dict[int, int]:
    """id(slot) -> target index, for slots held in the optimizer's per-variable lists.

    Keras keeps each kind of slot in a list indexed by the variable's index in
    the list it was built on (``self._r[self._get_variable_index(var)]``): the
    slots it makes without a reference variable (Adafactor's factored moments
    and placeholder scalars) belong to a target by their place there.
    """
    found: dict[int, int] = {}
    for attr, value in vars(opt).items():
        if attr in ("_variables", "_trainable_variables") or not isinstance(value, list) or len(value) != n:
            continue
        for i, item in enumerate(value):
            if item is not None and id(item) in slot_ids and found.setdefault(id(item), i) != i:
                raise StrategyError(
                    f"cannot move the optimizer slots of {type(opt).__name__} to new owners: slot "
                    f"{getattr(item, 'path', item.name)!r} is listed for two variables"
                )
    return found


def _dtype_name(dtype: Any) -> str:
    return tf.as_dtype(dtype).name


def slot_table(opt: Any, fixed_ids: set[int], targets: Sequence[Any]) -> SlotTable:
    """The optimizer's slots by kind and target.

    Which target a slot belongs to was recorded when the optimizer made it
    (``_kungfu_slot_targets``: slot id -> target id, by the wrapped class's
    ``add_variable_from_reference``), or is its place in one of the
    optimizer's per-variable lists (:func:`_listed_targets`). Keras makes
    slots in no one order (SGD kind by kind, Adam target by target:
    momentum, velocity, momentum, ...). The k-th slot made for a target is of
    kind k; targets may have different numbers of slots, of any shape, but a
    shard's slots must have its shape (they are cut from its variable's).

    Raises:
        StrategyError: a slot of no known target, or a shard's slot not of the shard's shape: they cannot be
            moved.
    """
    slots = [v for v in opt.variables if id(v) not in fixed_ids]
    if not targets:
        if slots:
            raise StrategyError(f"{type(opt).__name__} has {len(slots)} slot variables but updates no variable here")
        return []
    owner_of = opt.__dict__.get("_kungfu_slot_targets", {})
    index = {id(t): i for i, t in enumerate(targets)}
    listed = _listed_targets(opt, {id(s) for s in slots if owner_of.get(id(s), -1) not in index}, len(targets))
    per_target: list[list[Any]] = [[] for _ in targets]
    for slot in slots:
        i = index.get(owner_of.get(id(slot), -1), listed.get(id(slot)))
        if i is None:
            raise StrategyError(
                f"cannot move the optimizer slots of {type(opt).__name__} to new owners: slot "
                f"{getattr(slot, 'path', slot.name)!r} was not made for a variable this rank updates "
                "(neither made with add_variable_from_reference nor held in a list by variable index)"
            )
        per_target[i].append(slot)
    whole = {id(v) for v in opt.__dict__.get("_kungfu_model_variables", targets)}
    for target, own in zip(targets, per_target):
        for slot in own:
            if len(slot.shape) > _MAX_RANK or _dtype_name(slot.dtype) not in _DTYPES:
                raise StrategyError(
                    f"cannot move the optimizer slots of {type(opt).__name__} to new owners: slot "
                    f"{getattr(slot, 'path', slot.name)!r} is {_dtype_name(slot.dtype)} {tuple(slot.shape)} (slots "
                    f"move in collectives of {', '.join(_DTYPES)}, of at most {_MAX_RANK} dimensions)"
                )
            if id(target) not in whole and tuple(slot.shape) != tuple(target.shape):
                raise StrategyError(
                    f"cannot move the optimizer slots of {type(opt).__name__} to new owners: slot "
                    f"{getattr(slot, 'path', slot.name)!r} of the shard {getattr(target, 'name', '?')!r} is "
                    f"{tuple(slot.shape)}, the shard {tuple(target.shape)}: a partitioned variable's slots are cut "
                    "from its own, and these are not of its shape (Adafactor's factored moments); keep the "
                    "variable whole (PS, PSLoadBalancing, AllReduce)"
                )
    kinds = max(len(s) for s in per_target)
    return [[own[k] if k < len(own) else None for own in per_target] for k in range(kinds)]


def agreed_slot_table(
    opt: Any, targets: Sequence[Any] | None, name: str, extra: Sequence[int] = ()
) -> tuple[SlotTable, int, list[int]]:
    """:func:`slot_table` for ``targets`` on every worker, agreed in one collective: (this worker's table, the
    most slot kinds of any worker's targets, the maximum over the workers of each of ``extra``).

    ``targets``: None where this worker contributes no slots (a joiner's
    warm-up made its own). A refusal on some workers only (slots that cannot
    be told apart by variable, a shard's factored slots) would raise on
    some and leave the others waiting in the next collective: every worker
    raises the same StrategyError instead.

    Raises:
        StrategyError: on every worker.
    """
    refused, table = "", []
    if targets is not None:
        try:
            table = slot_table(opt, opt._kungfu_fixed_variable_ids, targets)
        except StrategyError as e:
            refused = str(e)
    with tf.init_scope():  # the optimizer may be built while a step is traced
        agreed = collective.all_reduce(tf.constant([len(table), int(bool(refused)), *extra], tf.int32), op="max",
                                       name=name, topology="STAR").numpy().tolist()  # fmt: skip
    if agreed[1]:
        reason = refused or "another worker's cannot move"
        if not reason.startswith("cannot move"):
            reason = f"cannot move the optimizer slots of {type(opt).__name__} to new owners: {reason}"
        raise StrategyError(reason)
    return table, agreed[0], agreed[2:]




def agreed_layout(known: dict[tuple[int, int], tuple[tuple[int, ...], str]], kinds: int, count: int,
                  name: str) -> list[SlotLayout]:  # fmt: skip
    """``layout[vi][k]``: the shape and dtype of variable ``vi``'s slot of kind ``k`` on every worker (collective).

    ``known``: what this worker can tell, (kind, variable index) -> (shape,
    dtype name): the slots of what it updates (full arrays: a partitioned
    variable's have its shape). A worker that holds a variable's slots
    tells the others what to expect (a rank that owns nothing cannot know
    the shape of a factored slot). One max all-reduce carries every code and
    its negation, so that workers telling different layouts are found.

    Raises:
        StrategyError: on every worker, two workers tell different layouts for one slot.
    """
    width = 2 + _MAX_RANK
    codes = np.zeros([kinds, count, width], np.int64)
    for (k, vi), (shape, dtype) in known.items():
        codes[k, vi, 0], codes[k, vi, 1] = 1 + _DTYPES.index(dtype), len(shape)
        codes[k, vi, 2 : 2 + len(shape)] = shape
    told = np.zeros([kinds, count, 1], np.int64)
    for k, vi in known:
        told[k, vi] = 1
    negated = np.where(told > 0, (1 << 40) - codes, 0)  # max of (2^40 - c) is 2^40 - min c over the workers that tell
    with tf.init_scope():
        agreed = collective.all_reduce(tf.constant(np.concatenate([codes, negated], axis=2).reshape(-1)), op="max",
                                       name=name, topology=one_off_topology(codes.nbytes * 2)).numpy()  # fmt: skip
    agreed = agreed.reshape(kinds, count, 2 * width)
    most, fewest = agreed[:, :, :width], np.where(agreed[:, :, width:] > 0, (1 << 40) - agreed[:, :, width:], 0)
    if np.any((most[:, :, 0] > 0) & np.any(most != fewest, axis=2)):
        raise StrategyError(f"cannot move the optimizer slots to new owners: workers hold slots of different shapes or "
                            f"dtypes for one variable ({name})")
    layout: list[SlotLayout] = [[None] * kinds for _ in range(count)]
    for k in range(kinds):
        for vi in range(count):
            code = most[k, vi]
            if code[0]:
                layout[vi][k] = (tuple(int(d) for d in code[2 : 2 + code[1]]), _DTYPES[code[0] - 1])
    return layout


def _region(node: Any, target: Any, variable: Any) -> tuple[slice, ...]:
    """Where ``target`` (the variable itself, or one shard of it) lies in ``variable``."""
    if target is variable or node.bounds is None:
        return tuple(slice(None) for _ in variable.shape)
    region = [slice(None)] * len(variable.shape)
    region[node.axis] = slice(*node.bounds)
    return tuple(region)


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


def _unit_region(node: Any, variable: Any) -> tuple[Any, ...]:
    """Where a unit (a whole variable or one shard, by its node) lies in ``variable`` (or in its slots)."""
    if not node.is_shard:
        return (Ellipsis,)  # a whole variable's slots may have shapes of their own
    region: list[Any] = [slice(None)] * len(variable.shape)
    region[node.axis] = slice(*node.bounds)
    return tuple(region)


def _numpy_of(dtype_name: str) -> Any:
    return tf.as_dtype(dtype_name).as_numpy_dtype


# (kind, variable index, where in the full slot (None: all of it), the values)
_Piece = tuple[int, int, "tuple[Any, ...] | None", np.ndarray]


def _held_pieces(old: StrategyPlan, table: SlotTable, variables: list[Any], contributes: bool, first: bool,
                 lost_owners: frozenset[int]) -> list[_Piece]:  # fmt: skip
    """The slots this worker gives to the gather (:func:`_sum_slots`)."""
    pieces: list[_Piece] = []
    if contributes and table:
        index = {id(t): i for i, t in enumerate(old.targets)}
        for vi, node, target in old.placements():
            if target is None or (node.kind != "ps" and not first):
                continue
            region = None if target is variables[vi] else _region(node, target, variables[vi])
            for k, row in enumerate(table):
                slot = row[index[id(target)]]
                if slot is not None:
                    pieces.append((k, vi, region, np.asarray(slot.numpy())))
    if contributes and first:
        nodes = {(vi, ui): unit.node for vi, ui, unit in old.replicable_units()}
        for (vi, ui), replicas in old.slot_replicas.items():
            node = nodes[(vi, ui)]
            if node.owner in lost_owners:
                region = _unit_region(node, variables[vi]) if node.is_shard else None
                pieces.extend((k, vi, region, np.asarray(r.numpy())) for k, r in enumerate(replicas) if r is not None)
    return pieces


def _sum_slots(
    old: StrategyPlan, table: SlotTable, kinds: int, variables: list[Any], contributes: bool,
    first: bool, prefix: str, lost_owners: frozenset[int] = frozenset(),
) -> FullSlots:  # fmt: skip
    """Every slot of every model variable, as full arrays (kind × variable), on every worker (module docstring).

    The slots of a unit whose owner (a rank of ``old``) is in ``lost_owners``
    come from the first worker's replica of them, if the plan kept replicas.
    Which slots exist, and their shapes, are agreed first (:func:`agreed_layout`):
    a worker cannot know a factored slot's shape for a variable it does not update.
    """
    pieces = _held_pieces(old, table, variables, contributes, first, lost_owners)
    known = {(k, vi): (tuple(variables[vi].shape) if region is not None else tuple(values.shape),
                       _dtype_name(values.dtype)) for k, vi, region, values in pieces}  # fmt: skip
    layout = agreed_layout(known, kinds, len(variables), f"{prefix}/slots/layout")
    full: FullSlots = [
        [None if layout[vi][k] is None else np.zeros(layout[vi][k][0], _numpy_of(layout[vi][k][1]))  # type: ignore[index]
         for vi in range(len(variables))]
        for k in range(kinds)
    ]  # fmt: skip
    for k, vi, region, values in pieces:
        target = full[k][vi]
        assert target is not None
        target[region if region is not None else ...] = values
    by_dtype: dict[np.dtype, list[tuple[int, int]]] = {}
    for k in range(kinds):
        for vi in range(len(variables)):
            array = full[k][vi]
            if array is not None:
                by_dtype.setdefault(array.dtype, []).append((k, vi))
    for n, (dtype, keys) in enumerate(sorted(by_dtype.items(), key=lambda kv: str(kv[0]))):
        flat = np.concatenate([full[k][vi].reshape(-1) for k, vi in keys])  # type: ignore[union-attr]
        summed = collective.all_reduce(
            tf.constant(flat), op="sum", name=f"{prefix}/slots/{n}", topology=one_off_topology(flat.nbytes)
        ).numpy()
        offset = 0
        for k, vi in keys:
            array = full[k][vi]
            assert array is not None
            full[k][vi] = summed[offset : offset + array.size].reshape(array.shape).astype(dtype)
            offset += array.size
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


def _layout_of(full: FullSlots, kinds: int, count: int) -> list[SlotLayout]:
    """``layout[vi][k]`` of gathered slots (the same on every worker)."""
    return [[None if full[k][vi] is None else (tuple(full[k][vi].shape), _dtype_name(full[k][vi].dtype))  # type: ignore[union-attr]
             for k in range(kinds)] for vi in range(count)]  # fmt: skip


def keep_slot_replicas(opt: Any, full: FullSlots | None = None, kinds: int | None = None) -> None:
    """In an elastic job, ``opt``'s plan keeps every parameter-server unit's optimizer slots on every rank
    (:meth:`StrategyPlan.keep_slot_replicas`), so that a crashed owner's slots survive.

    ``full``: the slots the plan starts with (after a re-plan), None for a
    fresh optimizer (the replicas start as the owners' slots); ``kinds``:
    the slot kinds, agreed (after a re-plan); None: agreed here. Either way,
    when the plan has parameter servers, one collective that every worker
    reaches when it builds the optimizer (:func:`agreed_slot_table`) agrees
    on two things: ``KUNGFU_SLOT_REPLICAS=0`` on any worker turns the
    replicas off on all (a crashed owner's slots then restart as a fresh
    optimizer's), and an optimizer whose slots cannot follow their
    variables to new owners (Adafactor's factored moments on the shards of
    a partitioned variable) is refused on every worker now, before it
    trains, rather than failing every worker at the first membership change
    (a rank that owns no variable cannot tell: alone, the owners would have
    raised and the others waited). Nothing to keep: an all-reduce plan, a
    joiner's warm-up plan, an optimizer without slots (plain SGD).

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
            "strategy (AllReduce, PartitionedAR), keep the variables whole (PS, PSLoadBalancing), or use an "
            "optimizer whose slots have their variables' shapes (SGD, Adam, RMSprop, ...)"
        ) from e
    kinds = most if kinds is None else kinds
    plan.slot_kinds = kinds
    if off_somewhere or not kinds or not plan.replicable_units():
        return
    # Every target, with no slot at all too (Muon's variables that take their gradient as their value).
    slots_of = {id(t): [table[k][i] if k < len(table) else None for k in range(kinds)] for i, t in enumerate(plan.targets)}
    variables = list(opt._kungfu_model_variables)
    if full is None:
        known = {}
        for vi, node, target in plan.placements():
            if target is not None and node.kind == "ps":
                for k, slot in enumerate(slots_of[id(target)]):
                    if slot is not None:
                        shape = tuple(variables[vi].shape) if node.is_shard else tuple(slot.shape)
                        known[(k, vi)] = (shape, _dtype_name(slot.dtype))
        layout = agreed_layout(known, kinds, len(variables), f"{plan.name}/slot_replicas/layout")
    else:
        layout = _layout_of(full, kinds, len(variables))

    def unit_layout(vi: int, node: Any) -> SlotLayout:
        return [None if s is None else (tuple(node.shape) if node.is_shard else s[0], s[1]) for s in layout[vi]]

    def initial(vi: int, node: Any) -> list[np.ndarray | None]:
        assert full is not None
        region = _unit_region(node, variables[vi])
        return [None if full[k][vi] is None else full[k][vi][region] for k in range(kinds)]  # type: ignore[index]

    plan.keep_slot_replicas(slots_of, unit_layout, initial if full is not None else None)


def _cut_before_rebuild(plan: StrategyPlan, variables: list[Any], full: FullSlots, opt: Any) -> None:
    """Refuses, before the optimizer changes, a plan that partitions a variable whose slots are not of its shape
    (Adafactor's factored moments cannot be cut into shards); the same on every worker (``full`` is)."""
    nodes: dict[int, list[Any]] = {}
    for vi, node, _ in plan.placements():
        nodes.setdefault(vi, []).append(node)
    for vi, own in nodes.items():
        if not own[0].is_shard or all(n.kind == "all_reduce" for n in own):
            continue  # whole, or stitched (its slots are the variable's own)
        for row in full:
            if row[vi] is not None and tuple(row[vi].shape) != tuple(variables[vi].shape):  # type: ignore[union-attr]
                raise StrategyError(
                    f"{type(opt).__name__}'s slots of {getattr(variables[vi], 'path', variables[vi].name)!r} are "
                    f"{tuple(row[vi].shape)}, the variable {tuple(variables[vi].shape)}: they cannot be cut into the "  # type: ignore[union-attr]
                    "shards the new strategy partitions it into; keep it whole (PS, PSLoadBalancing, AllReduce)"
                )


def install_plan(opt: Any, strategy: strategy_pb2.Strategy, kinds: int, full: FullSlots) -> int:
    """Replaces ``opt``'s plan by one for ``strategy``, its slots cut from ``full``; returns the new plan generation.

    Collective (the plan's consensus on the strategy bytes). The wrapped
    optimizer is rebuilt with ``opt._kungfu_build_base`` and the plan's shard
    variables made with ``opt._kungfu_make_variable`` (set when it was built).
    A slot of which nothing was gathered (a crashed owner's, without
    replicas) starts as a fresh optimizer's.

    Raises:
        StrategyError: on every worker, before the optimizer changes, ``strategy`` partitions a variable whose
            slots cannot be cut; after it, the rebuilt optimizer's slots do not fit the gathered ones.
    """
    old: StrategyPlan = opt._kungfu_plan
    variables = list(opt._kungfu_model_variables)
    fixed = opt._kungfu_fixed_variable_ids
    with tf.init_scope():  # a joiner's first plans were its own: the members' count goes on
        serial = 1 + int(collective.all_reduce(tf.constant(old.serial, tf.int32), op="max",
                                               name=f"{old.name}/install_serial", topology="STAR"))  # fmt: skip
    plan = StrategyPlan(strategy, variables, name=old.name, make_variable=opt._kungfu_make_variable, serial=serial)
    _cut_before_rebuild(plan, variables, full, opt)
    for slot in [v for v in opt.variables if id(v) not in fixed]:  # a joiner's too (made by its warm-up)
        opt._untrack_variable(slot)
    opt._trainable_variables_indices = {}
    opt.__dict__["_kungfu_slot_targets"] = {}
    opt.built = False
    object.__setattr__(opt, "_kungfu_plan", plan)
    object.__setattr__(opt, "_kungfu_warm_up_plan", False)
    old.forget_stored()  # a stale plan's values, slots and pushes: 4 versions each, a leak at every change
    decay_parts_as_their_variables(opt, [(variables[vi], t) for vi, _, t in plan.placements() if t is not None])
    rebuild_keeping_step_state(opt, lambda: opt._kungfu_build_base(plan.targets))
    new_table, most, _ = agreed_slot_table(opt, plan.targets, f"{plan.name}/install_slots")
    if most > kinds:  # kinds of which nothing was gathered (their only holder crashed, without replicas)
        full = [*full, *([None] * len(variables) for _ in range(most - kinds))]
        kinds = most
    index = {id(t): i for i, t in enumerate(plan.targets)}
    misfit, fresh = "", False
    for vi, node, target in plan.placements():
        if target is None:
            continue
        region = (Ellipsis,) if target is variables[vi] else _region(node, target, variables[vi])
        for k in range(kinds):
            slot, source = new_table[k][index[id(target)]] if k < len(new_table) else None, full[k][vi]
            if slot is None and source is not None:
                misfit = misfit or f"{getattr(variables[vi], 'path', '?')!r} has no slot of kind {k} now"
            elif slot is not None and source is None:
                fresh = True  # nothing gathered (its only holder crashed, without replicas): as built
            elif slot is not None and source is not None:
                part = source[region]
                if tuple(part.shape) != tuple(slot.shape):
                    misfit = misfit or f"slot {getattr(slot, 'path', slot.name)!r} is {tuple(slot.shape)}, gathered {part.shape}"
                else:
                    slot.assign(part)
    with tf.init_scope():
        failed, fresh_somewhere = collective.all_reduce(tf.constant([int(bool(misfit)), int(fresh)], tf.int32),
                                                        op="max", name=f"{plan.name}/install_slots/fit",
                                                        topology="STAR").numpy().tolist()  # fmt: skip
    if failed:
        raise StrategyError(f"{type(opt).__name__}'s rebuilt slots do not fit the gathered ones: "
                            f"{misfit or 'on another worker'}")  # fmt: skip
    if kinds:
        # Replicas start as the gathered slots; where some slot was built afresh instead, as the owners' slots
        # (one broadcast per unit): the other ranks' replicas must have the owner's layout.
        keep_slot_replicas(opt, None if fresh_somewhere else full, kinds)
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
