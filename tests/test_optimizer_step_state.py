"""kungfu_tf/optimizers/optimizer_step_state.py on Keras optimizers in one process (the elastic job that needs it:
tests/test_elastic_strategy.py, Nadam under PS with its owner SIGKILLed)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import assert_job_ok, run_job

from kungfu_tf.optimizers.optimizer_step_state import (
    advance_step_state,
    mark_step_state,
    rebuild_keeping_step_state,
)
from kungfu_tf.strategy.errors import StrategyError


def built(opt: keras.optimizers.Optimizer, variables: list[keras.Variable]) -> keras.optimizers.Optimizer:
    # As the strategy wrapper does: what exists before build is fixed, slots are recorded by reference.
    object.__setattr__(opt, "_kungfu_fixed_variable_ids", {id(v) for v in opt.variables})
    opt.build(variables)
    opt.__dict__["_kungfu_slot_targets"] = {id(s): id(variables[0]) for s in opt.variables
                                            if id(s) not in opt._kungfu_fixed_variable_ids and len(s.shape)}  # fmt: skip
    mark_step_state(opt)
    return opt


def test_nadams_u_product_is_step_state_and_adams_slots_are_not():
    w = keras.Variable(np.ones(3, np.float32))
    nadam = built(keras.optimizers.Nadam(0.1), [w])
    assert [v for v in nadam.variables if id(v) in nadam._kungfu_step_state_ids] == [nadam._u_product]
    assert id(nadam._u_product) in nadam._kungfu_fixed_variable_ids
    adam = built(keras.optimizers.Adam(0.1), [keras.Variable(np.ones(3, np.float32))])
    assert adam._kungfu_step_state_ids == set()


def test_adafactors_placeholders_in_lists_are_not_step_state():
    # Two scalars per 1-D variable, made without a reference and kept in lists: not per-step state, and they
    # differ between ranks under PS (each has its own variables'); as step state they entered the replicated
    # variables and the broadcast's consensus failed.
    opt = built(keras.optimizers.Adafactor(0.1), [keras.Variable(np.ones(3, np.float32))])
    assert sum(len(v.shape) == 0 for v in opt.variables) == 4  # iteration, learning rate, two placeholders
    assert opt._kungfu_step_state_ids == set()


def test_a_worker_that_updates_nothing_advances_the_step_state_as_an_owner_does():
    owner_w, idle_w = keras.Variable(np.ones(3, np.float32)), keras.Variable(np.ones(3, np.float32))
    owner, idle = built(keras.optimizers.Nadam(0.1), [owner_w]), built(keras.optimizers.Nadam(0.1), [idle_w])
    for _ in range(3):
        owner.apply([np.full(3, 0.5, np.float32)], [owner_w])
        advance_step_state(idle)
        idle._iterations.assign_add(1)
    assert float(owner._u_product.numpy()) != 1.0
    assert float(idle._u_product.numpy()) == float(owner._u_product.numpy())


def test_with_accumulated_gradients_only_the_steps_that_update_advance_it():
    owner_w, idle_w = keras.Variable(np.ones(3, np.float32)), keras.Variable(np.ones(3, np.float32))
    owner = built(keras.optimizers.Nadam(0.1, gradient_accumulation_steps=2), [owner_w])
    idle = built(keras.optimizers.Nadam(0.1, gradient_accumulation_steps=2), [idle_w])
    seen = []
    for _ in range(4):
        owner.apply([np.full(3, 0.5, np.float32)], [owner_w])
        advance_step_state(idle)
        idle._iterations.assign_add(1)
        seen.append(float(idle._u_product.numpy()))
        assert seen[-1] == float(owner._u_product.numpy())
    assert seen[0] == 1.0 and seen[1] != 1.0 and seen[2] == seen[1] and seen[3] != seen[2]


def test_a_rebuild_keeps_the_step_state_variable_its_name_and_value():
    w = keras.Variable(np.ones(3, np.float32))
    opt = built(keras.optimizers.Nadam(0.1), [w])
    opt.apply([np.full(3, 0.5, np.float32)], [w])
    before, value, name = opt._u_product, float(opt._u_product.numpy()), opt._u_product.path

    def rebuild() -> None:
        for slot in [v for v in opt.variables if id(v) not in opt._kungfu_fixed_variable_ids]:
            opt._untrack_variable(slot)
        opt._trainable_variables_indices = {}
        opt.built = False
        opt.build([w])

    rebuild_keeping_step_state(opt, rebuild)
    assert opt._u_product is before and opt._u_product.path == name and float(opt._u_product.numpy()) == value
    assert sum(v is before for v in opt.variables) == 1 and len(opt.variables) == 5  # its, lr, m, v, u_product
    opt.apply([np.full(3, 0.5, np.float32)], [w])  # trains on with the kept one
    assert float(opt._u_product.numpy()) < value


def test_a_rebuild_that_does_not_make_the_step_state_again_is_refused():
    w = keras.Variable(np.ones(3, np.float32))
    opt = built(keras.optimizers.Nadam(0.1), [w])

    def rebuild_without_it() -> None:
        opt._track_variable(keras.Variable(0.0))  # a scalar in no attribute of the optimizer: not step state

    with pytest.raises(StrategyError, match=r"Nadam made 0 step-state scalars .* 1 at its first build"):
        rebuild_keeping_step_state(opt, rebuild_without_it)


def test_a_worker_that_owns_nothing_counts_its_steps_with_accumulated_gradients():
    # tests/workers/ps_gradient_accumulation.py: Nadam(gradient_accumulation_steps=2) under PS at np=2, rank 1
    # owning nothing. It died in its first step (Keras's `iterations` is a tensor when gradients accumulate);
    # now both ranks equal one process, steps, weights and u_product.
    rc, out, err = run_job(2, "ps_gradient_accumulation.py", timeout=120)
    assert_job_ok(rc, out, err, 2, expected_checks=4)
