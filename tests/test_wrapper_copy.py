"""What the Keras wrappers' copy of an optimizer keeps (kungfu_tf/optimizers/_wrapping.py).

Every Keras wrapper (SynchronousSGDOptimizer, with or without a strategy,
SynchronousAveragingOptimizer, PairAveragingOptimizer) is a copy of the user's
optimizer rebuilt from its config. Three things were lost on the way:

* ``exclude_from_weight_decay`` (not in the config): AdamW decayed the biases
  and LayerNorm scales its user excluded, silently; and a strategy's shard of a
  partitioned variable was not excluded with its variable
  (tests/workers/weight_decay_exclusion.py, np=2, against one process);
* a learning-rate schedule class of the user's own, not registered with
  Keras's serialisation (a warm-up): ``from_config`` raised ``Could not locate
  class``, so no wrapper could be made (tests/workers/custom_schedule.py, np=2
  ``fit``, against one process); a schedule without ``get_config`` and a
  callable rate (a lambda) raised too;
* the names of an already-built optimizer's slots: rebuilt outside its name
  scope, Adafactor's slots of a bias lost their ``adafactor/`` prefix, which a
  joiner whose first step built them has (an elastic job's signature compares
  them).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import assert_job_ok, run_job

from kungfu_tf.optimizers import (
    PairAveragingOptimizer,
    SynchronousAveragingOptimizer,
    SynchronousSGDOptimizer,
)

WRAPPERS = {
    "sync-sgd": lambda opt: SynchronousSGDOptimizer(opt),
    "sync-sgd-strategy": lambda opt: SynchronousSGDOptimizer(opt, strategy="PSLoadBalancing"),
    "sync-averaging": lambda opt: SynchronousAveragingOptimizer(opt),
    "pair-averaging": lambda opt: PairAveragingOptimizer(opt),
}


@pytest.mark.parametrize("wrap", WRAPPERS.values(), ids=WRAPPERS.keys())
def test_every_wrapper_keeps_the_exclusions(wrap):
    kernel = keras.Variable(np.ones((3, 2), np.float32), name="kernel")
    bias = keras.Variable(np.ones(2, np.float32), name="bias")
    scale = keras.Variable(np.ones(2, np.float32), name="scale")
    inner = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    inner.exclude_from_weight_decay(var_list=[scale], var_names=["bias"])
    opt = wrap(inner)
    assert [opt._use_weight_decay(v) for v in (kernel, bias, scale)] == [True, False, False]


def test_workers_exclude_from_weight_decay_as_one_process():
    rc, out, err = run_job(2, "weight_decay_exclusion.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=5 * 4)


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, peak: float, steps: int) -> None:
        self.peak, self.steps = peak, steps

    def __call__(self, step):
        return self.peak * keras.ops.minimum(1.0, (keras.ops.cast(step, "float32") + 1.0) / self.steps)

    def get_config(self) -> dict:
        return {"peak": self.peak, "steps": self.steps}


@pytest.mark.parametrize("wrap", [*WRAPPERS.values(), lambda opt: SynchronousSGDOptimizer(
    keras.optimizers.LossScaleOptimizer(opt)).inner_optimizer], ids=[*WRAPPERS.keys(), "inside-loss-scale"])
def test_every_wrapper_takes_a_schedule_keras_cannot_find_by_name(wrap):
    schedule = Warmup(0.5, 4)
    opt = wrap(keras.optimizers.Adam(schedule))
    assert opt._learning_rate is schedule
    opt.iterations.assign(1)
    assert float(opt.learning_rate) == pytest.approx(0.25)


class Constant(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule without get_config: serialising it raises NotImplementedError."""

    def __call__(self, step):
        return 0.125


@pytest.mark.parametrize("rate", [Constant(), lambda: 0.125], ids=["schedule-without-config", "lambda"])
@pytest.mark.parametrize("wrap", [*WRAPPERS.values(), lambda opt: SynchronousSGDOptimizer(
    keras.optimizers.LossScaleOptimizer(opt)).inner_optimizer], ids=[*WRAPPERS.keys(), "inside-loss-scale"])
def test_rates_keras_cannot_serialise_are_taken_as_they_are(wrap, rate):
    # Both raised when the wrapper was made: the schedule in get_config, the lambda in from_config (safe_mode),
    # or in get_config where its source cannot be read.
    inner = keras.optimizers.SGD(rate)
    opt = wrap(inner)
    assert opt._learning_rate is rate and float(opt.learning_rate) == 0.125
    assert inner._learning_rate is rate  # the user's optimizer is left as it was


def test_workers_fit_with_the_schedule_as_one_process():
    rc, out, err = run_job(2, "custom_schedule.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=2 * 5)


BUILT_OK = {k: w for k, w in WRAPPERS.items() if k != "sync-sgd-strategy"}  # a strategy takes unbuilt ones only


@pytest.mark.parametrize("wrap", BUILT_OK.values(), ids=BUILT_OK.keys())
def test_a_built_optimizer_is_copied_with_its_slots_names_and_values(wrap):
    kernel = keras.Variable(np.ones((4, 3), np.float32), name="kernel")
    bias = keras.Variable(np.ones(3, np.float32), name="bias")
    opt = keras.optimizers.Adafactor(0.01, epsilon_1=1e-8)
    opt.apply([np.full((4, 3), 0.5, np.float32), np.full(3, 0.5, np.float32)], [kernel, bias])  # built by its step
    copy = wrap(opt)
    assert [v.path for v in copy.variables] == [v.path for v in opt.variables]
    for mine, theirs in zip(copy.variables, opt.variables):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
