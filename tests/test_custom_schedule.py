"""A learning-rate schedule class of the user's own (not registered with Keras's serialisation) through every
Keras wrapper: making the wrapper raised ``TypeError: Could not locate class 'Warmup'``, because the wrapper
is rebuilt from the optimizer's config (optimizers/_wrapping.py). Checked in one process on each wrapper
(and inside a ``LossScaleOptimizer``), and with real workers (tests/workers/custom_schedule.py, np=2, Keras
``fit``) against one process on the union batches.
"""

from __future__ import annotations

import keras
import pytest
from conftest import assert_job_ok, run_job

from kungfu_tf.optimizers import (
    PairAveragingOptimizer,
    SynchronousAveragingOptimizer,
    SynchronousSGDOptimizer,
)


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, peak: float, steps: int) -> None:
        self.peak, self.steps = peak, steps

    def __call__(self, step):
        return self.peak * keras.ops.minimum(1.0, (keras.ops.cast(step, "float32") + 1.0) / self.steps)

    def get_config(self) -> dict:
        return {"peak": self.peak, "steps": self.steps}


@pytest.mark.parametrize("wrap", [
    lambda opt: SynchronousSGDOptimizer(opt),
    lambda opt: SynchronousSGDOptimizer(opt, strategy="PSLoadBalancing"),
    lambda opt: SynchronousAveragingOptimizer(opt),
    lambda opt: PairAveragingOptimizer(opt),
    lambda opt: SynchronousSGDOptimizer(keras.optimizers.LossScaleOptimizer(opt)).inner_optimizer,
], ids=["sync-sgd", "sync-sgd-strategy", "sync-averaging", "pair-averaging", "inside-loss-scale"])  # fmt: skip
def test_every_wrapper_takes_a_schedule_keras_cannot_find_by_name(wrap):
    schedule = Warmup(0.5, 4)
    opt = wrap(keras.optimizers.Adam(schedule))
    assert opt._learning_rate is schedule
    opt.iterations.assign(1)
    assert float(opt.learning_rate) == pytest.approx(0.25)


def test_workers_fit_with_the_schedule_as_one_process():
    rc, out, err = run_job(2, "custom_schedule.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=2 * 5)
