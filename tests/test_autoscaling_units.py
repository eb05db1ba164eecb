"""Unit tests of the autoscaling policies' decision logic (no workers): AutoscalingPolicy (Or et al. §4),
ResourceProvisioningPolicy (KungFu Fig. 6), utility functions, against hand-computed and numpy references.

A fake context stands in for PolicyContext; ``simulate`` plays a job whose aggregate throughput at each
cluster size is given, applying shrinks at once and growths a few steps later (joiners warming up).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import kungfu_tf.policy.measured_scaling_policy as measured
from kungfu_tf.policy import (
    AutoscalingPolicy,
    ConcaveUtility,
    LinearUtility,
    ResourceProvisioningPolicy,
    ScalingSearch,
    StepUtility,
    check_utility,
)
from kungfu_tf.policy.scaling_conditions import scaling_efficiency

BATCH = 64
STEP_SECONDS = 0.5  # the fake clock advances this much per step


class FakeContext:
    """The parts of PolicyContext the policies use (names as in the issue 13 spec)."""

    def __init__(self, size: int, size_bounds=None, batch_size: int | None = BATCH):
        self.step = 0
        self.size = size
        self.samples = 0
        self.rank = 0
        self.metrics: dict = {}
        self.batch_size = batch_size
        self.size_bounds = size_bounds
        self.lines: list[str] = []
        self.requests: list[tuple[int, int, str]] = []
        self.reductions: list[tuple[int, str]] = []
        self.published: dict = {}  # every policy metric seen at some step

    def log(self, text: str) -> None:
        self.lines.append(text)

    def resize(self, new_size=None, reason: str = "", *, workers=None) -> None:
        assert workers is None
        self.requests.append((self.step, new_size, reason))

    def all_reduce(self, value, op: str = "mean", name=None):
        self.reductions.append((self.step, op))
        return np.asarray(value, np.float64)  # one worker: its own values are the agreed ones


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    clock = {"now": 1_000_000.0}
    monkeypatch.setattr(measured.time, "time", lambda: clock["now"])
    return clock


def simulate(policy, throughput, start, steps=400, bounds=None, grow_delay=3, reachable=None, clock=None,
             warmup_value=None, ctx=None):  # fmt: skip
    """Runs ``policy`` for ``steps`` steps; returns (sizes by step, ctx).

    ``throughput(size)``: the aggregate throughput at ``size`` workers. A growth request is applied
    ``grow_delay`` steps later if ``reachable(size)``; a shrink at once. ``warmup_value``: the
    throughput reported by the first 3 steps at a new size and by steps with a growth pending
    (the policy must not count them).
    """
    ctx = ctx or FakeContext(start, size_bounds=bounds)
    policy.before_train(ctx)
    size, pending, since_change = start, None, 0
    sizes = []
    handled = 0
    for step in range(steps):
        ctx.step, ctx.size = step, size
        value = throughput(size)
        if warmup_value is not None and (since_change < 3 or pending is not None):
            value = warmup_value
        ctx.metrics = {"throughput": value}
        if clock is not None:
            clock["now"] += STEP_SECONDS
        if policy.runs_at("after_step", step, 0):
            policy.after_step(ctx)
        ctx.published.update({k: v for k, v in ctx.metrics.items() if "/" in k})
        sizes.append(size)
        ctx.samples += BATCH
        since_change += 1
        for _, new, _ in ctx.requests[handled:]:
            if new < size:
                size, pending, since_change = new, None, 0
            elif new > size:
                pending = (new, step + grow_delay)
            else:
                pending = None  # a resize to the current size cancels a pending growth
        handled = len(ctx.requests)
        if pending is not None and step >= pending[1] and (reachable is None or reachable(pending[0])):
            size, pending, since_change = pending[0], None, 0
    return sizes, ctx


def first_failure_from(lo, hi, passes):
    """Reference: growing one worker at a time from ``lo``, the size before the condition first fails."""
    for k in range(lo, hi):
        if not passes(k, k + 1):
            return k
    return hi


def efficiency_passes(rates, threshold):
    return lambda a, b: ((rates[b] - rates[a]) / (b - a)) / (rates[a] / a) > threshold


# --- scaling search (Or et al. Fig. 3) ---------------------------------------------------------


def test_from_one_finds_the_plateau_and_settles_there():
    plateau = {1: 100.0, 2: 195.0, 3: 200.0, 4: 198.0}
    policy = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.5, warmup_steps=2)
    sizes, ctx = simulate(policy, plateau.get, start=1, bounds=(1, 4))
    assert policy.settled and policy.settled_size == 2 and sizes[-1] == 2
    # visited 1 -> 2 -> 3, then back to 2 (the condition 2->3 failed; no unmeasured size below 3)
    assert [new for _, new, _ in ctx.requests] == [2, 3, 2]
    assert sorted(policy.search.throughputs) == [1, 2, 3]
    assert policy.search.throughputs == pytest.approx({k: plateau[k] for k in (1, 2, 3)})
    assert first_failure_from(1, 4, efficiency_passes(plateau, 0.5)) == 2
    assert any("settled at 2 workers" in line for line in ctx.lines)
    assert any("efficiency s(2->3) = 0.051 <= S = 0.5" in line for line in ctx.lines)
    assert ctx.published["autoscaling/throughput_at_3"] == pytest.approx(200.0)
    assert ctx.published["autoscaling/efficiency_1_2"] == pytest.approx(0.95)
    # once settled the policy does not run: no per-step cost
    assert not policy.runs_at("after_step", 10_000, 0)


def test_from_the_upper_bound_searches_down():
    plateau = {1: 100.0, 2: 195.0, 3: 200.0, 4: 198.0}
    policy = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.5, max_size=4)
    sizes, ctx = simulate(policy, plateau.get, start=4, bounds=(1, 8))
    # 4 -> 3 (first move is -K) -> 2 (3->4 failed) -> 1 (2->3 failed); 1->2 passes: settle at 2
    assert [new for _, new, _ in ctx.requests] == [3, 2, 1, 2]
    assert policy.settled_size == 2 and sizes[-1] == 2


def test_after_a_successful_climb_it_settles_without_searching_below_the_start():
    """Or et al. §4.1 search down only when the first growth was not efficient. Started at 4 (bounds 1-8)
    on a job that scales to 6, the search went 4 -> 5 -> 6 -> 7 -> 3 -> 6 before: it measured a size below
    its start that could not change the verdict, and paid two resizes for it."""
    linear_to_6 = {k: 100.0 * min(k, 6) for k in range(1, 9)}
    policy = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.3)
    sizes, ctx = simulate(policy, linear_to_6.get, start=4, bounds=(1, 8))
    assert [new for _, new, _ in ctx.requests] == [5, 6, 7, 6]
    assert sorted(policy.search.throughputs) == [4, 5, 6, 7]
    assert policy.settled_size == 6 and sizes[-1] == 6


def test_a_first_growth_that_fails_searches_down_from_the_start():
    linear_to_2 = {k: 100.0 * min(k, 2) for k in range(1, 9)}
    policy = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.3)
    sizes, ctx = simulate(policy, linear_to_2.get, start=4, bounds=(1, 8))
    # 4 -> 5 fails at once: 4 -> 3 (3->4 fails) -> 2 (2->3 fails) -> 1: 1->2 passes: settle at 2
    assert [new for _, new, _ in ctx.requests] == [5, 3, 2, 1, 2]
    assert policy.settled_size == 2 and sizes[-1] == 2


def test_stops_going_down_as_soon_as_the_condition_passes():
    linear_to_3 = {1: 100.0, 2: 200.0, 3: 300.0, 4: 310.0, 5: 305.0}
    policy = AutoscalingPolicy(scale_every=4, efficiency_threshold=0.3)
    sizes, ctx = simulate(policy, linear_to_3.get, start=5, bounds=(1, 5))
    # 5 -> 4 (4->5 fails) -> 3: 3->4 fails -> 2: 2->3 passes: settle at 3 (size 1 never measured)
    assert [new for _, new, _ in ctx.requests] == [4, 3, 2, 3]
    # Measured exactly the sizes it ran at: size 1 never, and nothing recorded that was not measured.
    assert sorted(policy.search.throughputs) == [2, 3, 4, 5]
    assert sizes[-1] == 3


def test_steps_of_k_workers_and_bounds():
    rates = {n: 100.0 * min(n, 3) for n in range(1, 9)}
    policy = AutoscalingPolicy(scale_by=2, scale_every=4, efficiency_threshold=0.2, max_size=6)
    sizes, ctx = simulate(policy, rates.get, start=1, bounds=(1, 8))
    # grid 1, 3, 5 (+ the bound 6): 1->3 passes, 3->5 fails (s = 0): settle at 3
    assert [new for _, new, _ in ctx.requests] == [3, 5, 3]
    assert sizes[-1] == 3
    # the job's --max-np (size_bounds) caps the policy's max_size
    capped = AutoscalingPolicy(scale_by=2, scale_every=4, efficiency_threshold=0.2, max_size=6)
    _, ctx2 = simulate(capped, lambda n: 100.0 * n, start=1, bounds=(1, 4))
    assert [new for _, new, _ in ctx2.requests] == [3, 4]
    assert capped.settled_size == 4


@pytest.mark.parametrize("seed", range(20))
def test_random_curves_against_the_reference(seed):
    """Random throughput curves (noisy, saturating): from 1 with K=1 the policy settles where the
    independent reference says, from the top at the largest n whose condition n-1 -> n passes."""
    rng = np.random.default_rng(seed)
    top = int(rng.integers(3, 9))
    knee = rng.uniform(1.0, top + 1)
    rates = {n: float(100 * n / (1 + (n / knee) ** 3) ** (1 / 3) * rng.uniform(0.95, 1.05)) for n in range(1, top + 1)}
    threshold = float(rng.uniform(0.05, 0.9))
    passes = efficiency_passes(rates, threshold)

    up = AutoscalingPolicy(scale_every=3, efficiency_threshold=threshold, warmup_steps=1)
    sizes, _ = simulate(up, rates.get, start=1, bounds=(1, top), steps=40 * top)
    assert up.settled and sizes[-1] == first_failure_from(1, top, passes)

    down = AutoscalingPolicy(scale_every=3, efficiency_threshold=threshold, warmup_steps=1)
    sizes, _ = simulate(down, rates.get, start=top, bounds=(1, top), steps=40 * top)
    expected = next((n for n in range(top, 1, -1) if passes(n - 1, n)), 1)
    assert down.settled and sizes[-1] == expected


def test_warmup_and_pending_growth_steps_are_not_counted():
    rates = {1: 100.0, 2: 150.0, 3: 160.0}
    policy = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.3, warmup_steps=2)
    # the first 3 steps at each size (the step the size is first seen + warmup_steps) and the steps
    # waiting for joiners report an absurd throughput: the recorded means must not see it
    _, ctx = simulate(policy, rates.get, start=1, bounds=(1, 3), grow_delay=7, warmup_value=1e9)
    assert policy.search.throughputs == pytest.approx({1: 100.0, 2: 150.0, 3: 160.0})
    # one all_reduce per decision (three sizes measured), none per step
    assert len(ctx.reductions) == 3 and {op for _, op in ctx.reductions} == {"mean"}


def test_unreachable_growth_times_out_and_settles():
    rates = {n: 100.0 * n for n in range(1, 5)}
    policy = AutoscalingPolicy(scale_every=4, efficiency_threshold=0.5, grow_timeout_steps=20)
    sizes, ctx = simulate(policy, rates.get, start=1, bounds=(1, 4), reachable=lambda n: n <= 2)
    asked_3 = next(step for step, new, _ in ctx.requests if new == 3)
    settle = next((step, new) for step, new, _ in ctx.requests if step > asked_3)
    assert settle == (asked_3 + 20, 2)  # a resize to the current size: cancels the pending growth
    assert policy.settled_size == 2 and sizes[-1] == 2 and policy.search.unreachable == {3}
    assert any("did not grow to 3 workers within grow_timeout_steps=20" in line for line in ctx.lines)


def test_a_joiner_continues_the_same_search():
    """The state_dict (through JSON, as ElasticState carries it) taken mid-search gives the same result."""
    rates = {1: 100.0, 2: 190.0, 3: 270.0, 4: 280.0}
    reference = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.3)
    ref_sizes, ref_ctx = simulate(reference, rates.get, start=1, bounds=(1, 4), steps=200)

    first = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.3)
    _, ctx = simulate(first, rates.get, start=1, bounds=(1, 4), steps=30)
    assert not first.settled and first.search.throughputs
    joiner = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.3)
    joiner.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert joiner.state_dict() == first.state_dict()
    ctx.requests.clear()
    size = ref_sizes[30]
    ctx.size = size
    rest, ctx = _continue(joiner, rates.get, ctx, size, 30, 200)
    assert joiner.settled_size == reference.settled_size == 3
    assert rest == ref_sizes[30:] and rest[-1] == 3
    assert ctx.requests == [r for r in ref_ctx.requests if r[0] >= 30] != []


def _continue(policy, throughput, ctx, size, start_step, steps):
    # simulate's loop from start_step, with the pending growth (if any) applied 3 steps after it was asked
    sizes, pending = [], None
    if policy.measurement.pending is not None:
        pending = (policy.measurement.pending, policy.measurement.asked_at + 3)
    for step in range(start_step, steps):
        ctx.step, ctx.size = step, size
        ctx.metrics = {"throughput": throughput(size)}
        before = len(ctx.requests)
        if policy.runs_at("after_step", step, 0):
            policy.after_step(ctx)
        sizes.append(size)
        ctx.samples += BATCH
        for _, new, _ in ctx.requests[before:]:
            if new < size:
                size, pending = new, None
            elif new > size:
                pending = (new, step + 3)
        if pending is not None and step >= pending[1]:
            size, pending = pending[0], None
    return sizes, ctx


# --- utility vs cost (§4.2.2) ---------------------------------------------------------------------


RATES = {1: 100.0, 2: 190.0, 3: 260.0, 4: 300.0, 5: 320.0, 6: 330.0}


def linear_reference(value, deadline, price_per_hour):
    """Reference for LinearUtility: U(T(b)) - U(T(a)) = value/deadline * rem * (1/R_a - 1/R_b) and
    C(b) - C(a) = rem * P * (b/R_b - a/R_a): the remaining samples and elapsed time cancel."""
    p = price_per_hour / 3600.0
    k = np.arange(1, 7)
    r = np.array([RATES[i] for i in k])
    gain = value / deadline * (1 / r[:-1] - 1 / r[1:])
    cost = p * (k[1:] / r[1:] - k[:-1] / r[:-1])
    failing = np.nonzero(gain <= cost)[0]
    return int(k[failing[0]]) if failing.size else 6


def test_a_higher_price_picks_a_smaller_size(fake_clock):
    utility = LinearUtility(value=50.0, deadline=3600.0)
    prices = [0.0, 5.0, 30.0, 60.0, 120.0, 1000.0]
    chosen = []
    for price in prices:
        policy = AutoscalingPolicy(scale_every=5, utility=utility, price_per_worker_hour=price, total_samples=10**7)
        sizes, _ = simulate(policy, RATES.get, start=1, bounds=(1, 6), clock=fake_clock)
        assert policy.settled
        assert sizes[-1] == linear_reference(50.0, 3600.0, price), price
        chosen.append(sizes[-1])
    assert chosen == sorted(chosen, reverse=True) and chosen[0] == 6 and chosen[-1] == 1
    assert len(set(chosen)) >= 4  # the prices span the curve


def test_the_utility_condition_overrides_the_throughput_condition(fake_clock):
    # efficiency 3->4 is 0.46 (> S = 0.1), but at this price the 4th worker costs more than it gains
    policy = AutoscalingPolicy(scale_every=5, efficiency_threshold=0.1, utility=LinearUtility(50.0, 3600.0),
                               price_per_worker_hour=30.0, total_samples=10**7)  # fmt: skip
    sizes, ctx = simulate(policy, RATES.get, start=1, bounds=(1, 6), clock=fake_clock)
    assert sizes[-1] == linear_reference(50.0, 3600.0, 30.0) == 3
    assert any("marginal utility" in line and "marginal cost" in line for line in ctx.lines)


def test_utility_cost_uses_elapsed_and_remaining_time(fake_clock):
    """A concave utility: the margins depend on T_p and the remaining samples; compared with a direct
    computation from the policy's recorded decision inputs."""
    utility = ConcaveUtility(value=100.0, deadline=20000.0, power=2)
    policy = AutoscalingPolicy(scale_every=5, utility=utility, price_per_worker_hour=10.0, total_samples=2_000_000)
    _, ctx = simulate(policy, RATES.get, start=1, bounds=(1, 6), clock=fake_clock, steps=60)
    first = ctx.reductions[0][0]  # the step of the first decision
    cond = policy.condition(ctx, elapsed=123.0, size=1)
    remaining = 2_000_000 - ctx.samples
    t1, t2 = 123.0 + remaining / RATES[1], 123.0 + remaining / RATES[2]
    gain = utility(t2) - utility(t1)
    cost = remaining * (10.0 / 3600.0) * (2 / RATES[2] - 1 / RATES[1])
    assert cond.margins(1, RATES[1], 2, RATES[2]) == pytest.approx((gain, cost))
    assert first > 0


def test_step_utility_gets_t0_from_the_first_measurement(fake_clock):
    steps = StepUtility(steps=[(40000.0, 100.0)], late_value=0.0)
    policy = AutoscalingPolicy(scale_every=5, utility=steps, price_per_worker_hour=1.0, total_samples=10**7)
    simulate(policy, RATES.get, start=1, bounds=(1, 6), clock=fake_clock, steps=20)
    # T0: the time so far at the first decision + the remaining samples at R_1
    assert policy.initial_time is not None
    first_step = 2 + 1 + 4  # first seen at 0, warmup 1..2, measured 3..7
    elapsed = (first_step + 1) * STEP_SECONDS  # the clock advanced before each of steps 0..first_step
    assert policy.initial_time == pytest.approx(elapsed + (10**7 - first_step * BATCH) / RATES[1])


# --- utility functions ------------------------------------------------------------------------------


def test_step_utility_bridges_the_gaps():
    two = StepUtility(steps=[(100.0, 50.0)], late_value=10.0, initial_time=300.0)
    times = np.array([0.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0])
    # Fig. 5c: flat at 50 until T1 = 100, a line to (T0 = 300, 10), flat after
    assert [two(t) for t in times] == pytest.approx([50, 50, 50, 40, 30, 10, 10])
    assert [two(t) for t in times] == pytest.approx(np.interp(times, [100.0, 300.0], [50.0, 10.0]))
    # three levels: the middle step is replaced by the line to its rightmost point (T2, v2)
    three = StepUtility(steps=[(100.0, 90.0), (200.0, 60.0), (400.0, 30.0)], late_value=0.0, initial_time=800.0)
    grid = np.linspace(0, 1000, 101)
    expected = np.interp(grid, [100, 200, 400, 800], [90, 60, 30, 0])
    assert [three(t) for t in grid] == pytest.approx(expected)
    assert three.raw(150.0) == 60.0 and three(150.0) == pytest.approx(75.0)
    # without T0 (or T0 before the last deadline) the last drop stays a jump
    no_t0 = StepUtility(steps=[(100.0, 50.0)], late_value=10.0)
    assert no_t0(100.0) == 50.0 and no_t0(100.001) == 10.0
    assert StepUtility(steps=[(100.0, 50.0)], initial_time=80.0)(100.5) == 0.0
    check_utility(three, horizon=1000.0)
    check_utility(two.with_initial_time(500.0), horizon=1000.0)


def test_linear_and_concave_utilities():
    lin = LinearUtility(value=10.0, deadline=100.0)
    assert [lin(t) for t in (0, 50, 100, 150)] == pytest.approx([10, 5, 0, -5])
    con = ConcaveUtility(value=10.0, deadline=100.0, power=2)
    t = np.linspace(0, 200, 41)
    u = np.array([con(x) for x in t])
    assert u == pytest.approx(10 * (1 - (t / 100) ** 2))
    assert np.all(np.diff(u, 2) < 0)  # concave down
    assert np.all(np.diff(u) < 0)  # decreasing
    check_utility(lin), check_utility(con)


def test_check_utility_rejects_bad_functions():
    with pytest.raises(ValueError, match=r"must not increase with the completion time: U\(50 s\) = 0 < U\(.* s\) = 1"):
        check_utility(lambda t: 0.0 if t <= 50 else 1.0, horizon=100.0)
    with pytest.raises(ValueError, match=r"finite number, got U\(0 s\) = inf"):
        check_utility(lambda t: math.inf, horizon=100.0)
    with pytest.raises(ValueError, match=r"real number \(dollars\), got U\(0 s\) = 'a'"):
        check_utility(lambda t: "a", horizon=100.0)
    with pytest.raises(ValueError, match=r"utility raised at U\(0 s\): ZeroDivisionError"):
        check_utility(lambda t: 1 / t, horizon=100.0)
    with pytest.raises(ValueError, match=r"horizon must be a finite number > 0, got -1"):
        check_utility(lambda t: 0.0, horizon=-1)
    with pytest.raises(TypeError, match="must be a callable"):
        check_utility(3.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"efficiency_threshold": 1.5}, r"efficiency_threshold must be in \[0, 1\], got 1.5"),
        ({"efficiency_threshold": -0.1}, r"efficiency_threshold must be in \[0, 1\], got -0.1"),
        ({"scale_by": 0}, r"scale_by must be a positive int, got 0"),
        ({"scale_every": -3}, r"scale_every must be a positive int, got -3"),
        ({"warmup_steps": -1}, r"warmup_steps must be an int >= 0, got -1"),
        ({"grow_timeout_steps": 0}, r"grow_timeout_steps must be a positive int, got 0"),
        ({"min_size": 5, "max_size": 3}, r"min_size=5 > max_size=3"),
        ({"utility": LinearUtility(1.0, 10.0), "price_per_worker_hour": -1.0, "total_samples": 10},
         r"price_per_worker_hour must be a finite number >= 0, got -1.0"),
        ({"utility": lambda t: t, "price_per_worker_hour": 1.0, "total_samples": 10},
         r"utility must not increase with the completion time: U\(0 s\) = 0 < U\(0.001 s\) = 0.001"),
        ({"utility": LinearUtility(1.0, 10.0), "total_samples": 10}, r"utility= needs price_per_worker_hour="),
        ({"utility": LinearUtility(1.0, 10.0), "price_per_worker_hour": 1.0}, r"utility= needs total_samples="),
        ({"price_per_worker_hour": 1.0}, r"price_per_worker_hour is only used with utility="),
        ({"utility": LinearUtility(1.0, 10.0), "price_per_worker_hour": 1.0, "total_samples": 0},
         r"total_samples must be a positive int, got 0"),
    ],
)  # fmt: skip
def test_bad_autoscaling_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoscalingPolicy(**kwargs)


def test_bad_utility_and_provisioning_arguments():
    with pytest.raises(ValueError, match=r"values must decrease .* steps\[1\] value 60.0 >= steps\[0\] value 50.0"):
        StepUtility(steps=[(10.0, 50.0), (20.0, 60.0)])
    with pytest.raises(ValueError, match=r"deadlines must increase: steps\[1\] deadline 5.0 <= steps\[0\] deadline 10.0"):
        StepUtility(steps=[(10.0, 50.0), (5.0, 40.0)])
    with pytest.raises(ValueError, match=r"late_value 70.0 exceeds the last step's value 50.0"):
        StepUtility(steps=[(10.0, 50.0)], late_value=70.0)
    with pytest.raises(ValueError, match=r"power must be > 1 .* got 0.5"):
        ConcaveUtility(1.0, 10.0, power=0.5)
    with pytest.raises(ValueError, match=r"deadline must be a finite number > 0, got 0"):
        LinearUtility(1.0, 0)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.2"):
        ResourceProvisioningPolicy(alpha=1.2)
    with pytest.raises(ValueError, match=r"every must be a positive int, got 0"):
        ResourceProvisioningPolicy(every=0)
    with pytest.raises(ValueError, match=r"max_size must be a positive int or None, got 0"):
        ResourceProvisioningPolicy(max_size=0)


def test_throughput_metric_missing():
    policy = AutoscalingPolicy(scale_every=3)
    with pytest.raises(ValueError, match=r"needs ctx.metrics\['throughput'\].*batch_size="):
        policy.before_train(FakeContext(2, batch_size=None))
    ctx = FakeContext(2)
    policy.before_train(ctx)
    with pytest.raises(ValueError, match=r"AutoscalingPolicy needs ctx.metrics\['throughput'\]"):
        for step in range(5):
            ctx.step, ctx.metrics = step, {}
            policy.after_step(ctx)


def test_config_is_the_same_on_every_worker():
    def my_utility(t):
        return 10.0 - t / 100

    a = AutoscalingPolicy(utility=my_utility, price_per_worker_hour=1.0, total_samples=100).config()
    b = AutoscalingPolicy(utility=my_utility, price_per_worker_hour=1.0, total_samples=100).config()
    assert a == b and json.dumps(a) and "my_utility" in a["utility"] and "0x" not in a["utility"]
    assert AutoscalingPolicy(utility=LinearUtility(2.0, 5.0), price_per_worker_hour=1.0,
                             total_samples=1).config()["utility"] == "LinearUtility(value=2.0, deadline=5.0)"  # fmt: skip


def test_scaling_search_grid_and_efficiency():
    assert scaling_efficiency(4, 400.0, 5, 500.0) == 1.0 and scaling_efficiency(4, 400.0, 5, 450.0) == 0.5
    s = ScalingSearch(scale_by=3)
    s.record(8, 1.0)
    assert s.grid(1, 8, 8) == [1, 2, 5, 8]
    s.mark_unreachable(6)
    assert s.upper(8) == 5 and s.upper(None) == 5


# --- resource provisioning (KungFu Fig. 6) ---------------------------------------------------------------


def test_provisioning_keeps_workers_while_throughput_grows_enough():
    rates = {1: 100.0, 2: 190.0, 3: 260.0, 4: 270.0, 5: 275.0}
    policy = ResourceProvisioningPolicy(every=5, alpha=0.33)
    sizes, ctx = simulate(policy, rates.get, start=1, bounds=(1, 5))
    # reference: the first n whose added worker does not bring R_{n+1} > (1 + alpha/n) R_n
    ratios = np.array([rates[n + 1] / rates[n] for n in range(1, 5)])
    needed = 1 + 0.33 / np.arange(1, 5)
    expected = int(np.nonzero(ratios <= needed)[0][0]) + 1
    assert expected == 3
    assert [new for _, new, _ in ctx.requests] == [2, 3, 4, 3]  # the 4th worker is removed again
    assert sizes[-1] == 3 and policy.settled_size == 3
    assert any("R_4/R_3 = 1.0385 <= 1 + 0.33/3 = 1.1100" in line for line in ctx.lines)
    assert ctx.published["provisioning/gain_3_4"] == pytest.approx(270 / 260)


def test_provisioning_stops_at_the_upper_bound():
    policy = ResourceProvisioningPolicy(every=4, alpha=0.33, max_size=3)
    sizes, ctx = simulate(policy, lambda n: 100.0 * n, start=1, bounds=(1, 8))
    assert [new for _, new, _ in ctx.requests] == [2, 3]
    assert sizes[-1] == 3 and policy.settled_size == 3
    assert any("settled at 3 workers (at the upper bound 3)" in line for line in ctx.lines)


# --- with the real PolicyRunner (one process) ----------------------------------------------------------------


def test_with_the_real_runner_in_one_process(fake_clock):
    """The policy reads the runner's throughput metric, agrees with the real all_reduce, settles at the only
    allowed size (max_size=1) without a resize request and stops running; no batch_size: a ValueError."""
    from kungfu_tf.policy import PolicyRunner

    policy = AutoscalingPolicy(scale_every=3, warmup_steps=1, max_size=1)
    runner = PolicyRunner([policy], batch_size=8, verbose=False)
    ran = []
    with runner.training():
        for step in range(10):
            with runner.step():
                fake_clock["now"] += 1.0
            ran.append(policy.runs_at("after_step", step + 1, 0))
    assert policy.settled and policy.settled_size == 1
    assert runner.history == []  # no resize asked
    assert 0 < policy.search.throughputs[1] < math.inf
    assert ran.index(False) == 4  # first seen at step 0, warm-up step 1, measured 2..4: decided after step 4
    assert policy.decisions == 1
    assert any("autoscaling: settled at 1 workers" in line for line in runner.log_lines)

    no_batch = PolicyRunner([AutoscalingPolicy()], verbose=False)
    with pytest.raises(ValueError, match=r"AutoscalingPolicy needs ctx.metrics\['throughput'\].*batch_size="):
        no_batch.before_train()


def test_outside_an_elastic_job_only_the_current_size_is_measured():
    policy = AutoscalingPolicy(scale_every=3)
    sizes, ctx = simulate(policy, lambda n: 100.0 * n, start=2, bounds=None, steps=20)  # ctx.size_bounds is None
    assert policy.settled_size == 2 and ctx.requests == [] and set(sizes) == {2}
