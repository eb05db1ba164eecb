"""An optimizer's step state: what its ``build`` makes beside its slots, advanced once per step on every worker.

Keras's Nadam keeps ``u_product``, the product of its momentum schedule over
the steps so far: one scalar for all variables, made in ``build`` without a
reference variable and advanced in ``_backend_update_step``, which Keras's
``apply`` runs once per step. Under parameter servers a worker that owns
nothing in a step updates no variable, and its copy stayed behind; the owner
that replaced a crashed one then divided by the wrong bias correction. Such a
scalar is state of the step, not of a variable: every worker advances it
alike (:func:`advance_step_state`), so it is replicated as the step counter
is, never moved between owners, and it survives a rebuild of the optimizer on
a new plan (:func:`rebuild_keeping_step_state`).

Variables made without a reference that are not scalars, or not held by an
attribute of the optimizer (Adafactor's placeholders of 1-D variables, kept in
lists), are not step state: they stay unknown slots, which the slot table
refuses (strategy_replan.py).

Example (what ``SynchronousSGDOptimizer``'s wrapper does)::

    base.build(opt, targets)
    mark_step_state(opt)                # first build: Nadam's u_product joins the replicated variables
    ...
    advance_step_state(opt)             # a step in which this worker updates no variable
    rebuild_keeping_step_state(opt, lambda: opt._kungfu_build_base(new_targets))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from keras import ops

from kungfu_tf.strategy.errors import StrategyError


def _made_beside_slots(opt: Any, known_ids: set[int]) -> list[Any]:
    # Held by an attribute of its own (Nadam's _u_product): Adafactor's per-variable placeholder scalars, made
    # without a reference too but kept in lists, belong to variables (and are refused with them under PS).
    held = {id(value) for value in vars(opt).values()}
    slot_targets = opt.__dict__.get("_kungfu_slot_targets", {})
    return [
        v for v in opt.variables
        if id(v) in held and id(v) not in known_ids and id(v) not in slot_targets and tuple(v.shape) == ()
    ]  # fmt: skip


def mark_step_state(opt: Any) -> None:
    """After the first build: the scalars it made beside the slots join ``_kungfu_fixed_variable_ids`` (the
    variables the same on every worker) and are recorded as ``_kungfu_step_state_ids``."""
    fixed: set[int] = opt._kungfu_fixed_variable_ids
    state = {id(v) for v in _made_beside_slots(opt, fixed)}
    object.__setattr__(opt, "_kungfu_step_state_ids", state)
    object.__setattr__(opt, "_kungfu_fixed_variable_ids", fixed | state)


def advance_step_state(opt: Any) -> None:
    """What Keras's ``apply`` does to the step state in a step that updates variables, for a worker that
    updates none: ``_backend_update_step`` on no variables (Nadam advances ``u_product`` there), only on
    the steps that update when gradients accumulate. A no-op for optimizers without step state."""
    if not opt.__dict__.get("_kungfu_step_state_ids"):
        return

    def update() -> None:
        opt._backend_update_step([], [], opt.learning_rate)

    steps = opt.gradient_accumulation_steps
    if steps:
        ops.cond((opt._iterations + 1) % steps == 0, update, lambda: None)  # as Keras: the raw step count
    else:
        update()


def rebuild_keeping_step_state(opt: Any, build: Callable[[], None]) -> None:
    """``build()`` (the wrapped optimizer built anew on a new plan's targets, its old slots untracked by the
    caller) keeping the step state: ``build`` makes it again at its initial value (Nadam's ``u_product = 1``)
    under a new name (Keras numbers unnamed variables: ``variable_2``), so the attribute that holds each new
    scalar is given the old variable back, value and name, in the order ``build`` makes them. A joiner's
    state, and the signature that admits it, name the old one.

    Raises:
        StrategyError: the new build made a different number of step-state scalars.
    """
    old_ids: set[int] = opt.__dict__.get("_kungfu_step_state_ids", set())
    old = [v for v in opt.variables if id(v) in old_ids]
    base_fixed = opt._kungfu_fixed_variable_ids - old_ids
    build()
    new = _made_beside_slots(opt, base_fixed | old_ids)
    holders = {id(value): name for name, value in vars(opt).items() if any(value is v for v in new)}
    if len(new) != len(old):
        raise StrategyError(
            f"{type(opt).__name__} made {len(new)} step-state scalars (variables beside its slots) when rebuilt "
            f"for the new plan, {len(old)} at its first build: its state cannot be carried over"
        )
    for before, after in zip(old, new):
        opt._untrack_variable(after)
        object.__setattr__(opt, holders[id(after)], before)
