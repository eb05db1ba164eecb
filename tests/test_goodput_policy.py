"""``GoodputBatchSizePolicy`` and its model (kungfu_tf/policy/goodput.py) on a simulated cluster.

The simulated job's step time is ``t(B) = FIXED + PER_SAMPLE * B`` (the clock the policy reads is advanced
by it), and its noise scale is given per step. Checked against a numpy brute force of the true goodput:
the policy explores, then settles on the true optimum (within its reach per move), follows a growing
noise scale, stays put when larger batches do not pay, and decides from agreed values only.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import kungfu_tf.policy.goodput_batch_size as goodput_module
from kungfu_tf.policy import GoodputBatchSizePolicy
from kungfu_tf.policy.goodput import StepTimeModel, statistical_efficiency

FIXED, PER_SAMPLE = 0.012, 40e-6  # seconds: a 12 ms latency floor, 40 µs per sample


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class SimulatedContext:
    """The part of PolicyContext the policy uses; one worker or several agreeing ones (all_reduce: identity)."""

    def __init__(self, batch_size: int, size: int = 4):
        self.batch_size, self.size, self.step, self.epoch = batch_size, size, 0, 0
        self.metrics: dict = {}
        self.requests: list[int] = []
        self.reduced: list[str] = []

    def set_batch_size(self, value, reason=""):
        self.requests.append(value)
        self.batch_size = value

    def all_reduce(self, value, op="mean", name=None):
        self.reduced.append(name)
        return np.asarray(value, np.float64)


def train(policy, ctx, clock, steps, noise_at=lambda step: 500.0, fixed=FIXED):
    """Runs ``steps`` simulated steps; returns the batch in force at each."""
    batches = []
    for _ in range(steps):
        batches.append(ctx.batch_size)
        clock.now += fixed + PER_SAMPLE * ctx.batch_size
        ctx.metrics["gns"] = noise_at(ctx.step)
        policy.after_step(ctx)
        ctx.step += 1
    return batches


def true_goodput(batch, noise, low, fixed=FIXED):
    batch = np.asarray(batch, np.float64)
    return batch / (fixed + PER_SAMPLE * batch) * (noise + low) / (noise + batch)


def true_best(noise, low, high, unit, fixed=FIXED):
    grid = np.arange(low, high + 1, unit, dtype=np.float64)
    return int(grid[np.argmax(true_goodput(grid, noise, low, fixed))])


@pytest.fixture()
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(goodput_module.time, "perf_counter", c)
    return c


def test_the_model_fits_a_line_and_its_goodput_peaks_where_numpy_says():
    model = StepTimeModel.fit({64: FIXED + PER_SAMPLE * 64, 256: FIXED + PER_SAMPLE * 256, 128: FIXED + PER_SAMPLE * 128})
    assert (model.fixed, model.per_sample) == (pytest.approx(FIXED), pytest.approx(PER_SAMPLE))
    grid = range(64, 4097, 64)
    assert max(grid, key=lambda b: model.goodput(b, 500.0, 64)) == true_best(500.0, 64, 4096, 64)
    assert StepTimeModel.fit({64: 0.02}) is None  # one batch: fixed and per-sample cost not separable
    assert StepTimeModel.fit({64: 0.02, 128: 0.019}) == StepTimeModel(fixed=0.0195, per_sample=0.0)  # noise: flat
    assert statistical_efficiency(64, -3.0, 64) == 1 and statistical_efficiency(128, -3.0, 64) == 0.5


def test_explores_then_settles_on_the_true_optimum(clock):
    # A small min_gain: with exact measurements the policy must reach the exact optimum.
    policy = GoodputBatchSizePolicy(max_batch_size=4096, min_batch_size=64, every=5, round_to=16, min_gain=1.01)
    ctx = SimulatedContext(batch_size=64, size=4)
    batches = train(policy, ctx, clock, 200)
    best = true_best(500.0, 64, 4096, 64)
    assert 64 < best < 4096  # an interior optimum: neither bound decides
    # First interval unmeasured, second measures 64 and explores 128; each move goes at most 2x past the
    # largest batch measured; it ends at the optimum and stays.
    assert ctx.requests[0] == 128
    assert all(b <= 2 * max(ctx.requests[:i] + [64]) for i, b in enumerate(ctx.requests))
    assert batches[-1] == best and batches[-60:] == [best] * 60
    assert ctx.metrics["goodput/best_batch"] == best
    assert set(ctx.reduced) == {"kungfu_policy/goodput/step_time"}  # the step times are agreed


def test_the_batch_follows_a_growing_noise_scale(clock):
    policy = GoodputBatchSizePolicy(max_batch_size=8192, min_batch_size=64, every=5, round_to=16)
    ctx = SimulatedContext(batch_size=64, size=4)
    first = train(policy, ctx, clock, 150, noise_at=lambda step: 100.0)
    second = train(policy, ctx, clock, 150, noise_at=lambda step: 3000.0)
    # Hysteresis (min_gain 1.1): it stops where the optimum is less than 10 % better, and stays there.
    for batches, noise in ((first, 100.0), (second, 3000.0)):
        best = true_best(noise, 64, 8192, 64)
        assert true_goodput(batches[-1], noise, 64) * policy.min_gain >= true_goodput(best, noise, 64)
        assert batches[-50:] == [batches[-1]] * 50
    assert second[-1] > 2 * first[-1]


def test_does_not_move_when_a_larger_batch_does_not_pay(clock):
    # Almost no fixed cost and a small noise scale: doubling the batch would halve the steps' value.
    policy = GoodputBatchSizePolicy(max_batch_size=4096, min_batch_size=64, every=5)
    ctx = SimulatedContext(batch_size=64, size=4)
    batches = train(policy, ctx, clock, 100, noise_at=lambda step: 10.0, fixed=0.0001)
    assert ctx.requests == [] and set(batches) == {64}
    assert ctx.metrics["goodput/predicted_gain"] < policy.min_gain


def test_an_interval_with_a_change_is_not_measured_and_a_resize_forgets(clock):
    policy = GoodputBatchSizePolicy(max_batch_size=4096, min_batch_size=64, every=5, min_gain=100.0)  # never moves
    ctx = SimulatedContext(batch_size=64, size=4)
    train(policy, ctx, clock, 10)  # checks after steps 4 and 9: the first only sets the mark
    assert policy.step_times == {64: [pytest.approx(FIXED + PER_SAMPLE * 64)]}
    ctx.batch_size = 128  # another policy changed it after step 9
    train(policy, ctx, clock, 5)
    assert list(policy.step_times) == [64]  # steps 10-14 ran at 128, but the mark was taken at 64
    train(policy, ctx, clock, 5)
    assert policy.step_times[128] == [pytest.approx(FIXED + PER_SAMPLE * 128)]
    ctx.size = 2
    train(policy, ctx, clock, 5)
    assert policy.step_times == {} and policy.measured_size == 2
    assert ctx.requests == []


def test_state_reaches_a_joiner_and_it_decides_as_the_members(clock):
    member = GoodputBatchSizePolicy(max_batch_size=4096, min_batch_size=64, every=5)
    ctx = SimulatedContext(batch_size=64, size=4)
    train(member, ctx, clock, 40)
    joiner = GoodputBatchSizePolicy(max_batch_size=4096, min_batch_size=64, every=5)
    joiner.load_state_dict(member.state_dict())
    assert joiner.step_times == member.step_times and joiner.measured_size == 4
    twin = SimulatedContext(batch_size=ctx.batch_size, size=4)
    twin.step = ctx.step
    before = list(ctx.requests)
    train(member, ctx, clock, 30)
    clock.now -= 30 * (FIXED + PER_SAMPLE * twin.batch_size)  # replay the same 30 steps' time for the joiner
    train(joiner, twin, clock, 30)
    assert twin.requests == ctx.requests[len(before):]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be a positive int, got 0"),
        ({"max_batch_size": 64, "every": 1}, "every must be an int >= 2, got 1"),
        ({"max_batch_size": 64, "min_batch_size": 128}, r"min_batch_size must be an int in \[1, max_batch_size=64\]"),
        ({"max_batch_size": 64, "min_gain": 1.0}, "min_gain must be a number > 1, got 1.0"),
        ({"max_batch_size": 64, "max_extrapolation": math.nan}, "max_extrapolation must be a number > 1"),
    ],
)
def test_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GoodputBatchSizePolicy(**kwargs)
