"""``AutoscalingPolicy``: find the job's efficient cluster size while it trains (Or et al. §4).

Example (inside ``kungfu-run --elastic -np 1 --min-np 1 --max-np 4``):
    >>> from kungfu_tf.policy import AutoscalingPolicy, LinearUtility, PolicyRunner
    >>> by_throughput = AutoscalingPolicy(scale_by=1, scale_every=10, efficiency_threshold=0.3)
    >>> by_value = AutoscalingPolicy(utility=LinearUtility(value=50.0, deadline=3600.0),
    ...                              price_per_worker_hour=2.0, total_samples=500_000)
    >>> runner = PolicyRunner([by_throughput], batch_size=64)  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kungfu_tf.policy.measured_scaling_policy import MeasuredScalingPolicy, log_line
from kungfu_tf.policy.scaling_conditions import (
    ThroughputCondition,
    UtilityCostCondition,
    scaling_efficiency,
)
from kungfu_tf.policy.scaling_search import ScalingSearch
from kungfu_tf.policy.utility import (
    DEFAULT_HORIZON,
    ConcaveUtility,
    LinearUtility,
    StepUtility,
    check_utility,
)

if TYPE_CHECKING:
    from kungfu_tf.policy.context import PolicyContext


class AutoscalingPolicy(MeasuredScalingPolicy):
    """Or et al.'s scaling schedule (§4.1) with their two scaling conditions (§4.2).

    Each cluster size is measured for ``scale_every`` steps (N; the
    ``warmup_steps`` after each size change are skipped): ``R_k``, the
    aggregate throughput at ``k`` workers, is the mean of the runner's
    ``ctx.metrics["throughput"]`` (global batch / step time) over those steps
    and all workers (one ``all_reduce`` per decision). Then
    (:class:`~kungfu_tf.policy.scaling_search.ScalingSearch`): the first move
    adds ``scale_by`` workers (K; removes them when starting at the upper
    bound), more are added while the condition passes, and once it fails
    the search goes down to the next smaller size without statistics until
    it passes; the job settles at the largest size before the condition
    first fails, and the policy stops running.

    Conditions for growing from ``k`` to ``k + d`` workers:

    * throughput scaling efficiency (default):
      ``s_{k,d} = ((R_{k+d} - R_k) / d) / (R_k / k) > efficiency_threshold``;
    * with ``utility`` (a function of the completion time in seconds giving
      dollars, e.g. :class:`~kungfu_tf.policy.LinearUtility`), instead
      (it overrides the throughput condition, §4.2.2): marginal utility >
      marginal cost, ``U(T(k+d)) - U(T(k)) > C(k+d) - C(k)``, with
      ``T(k) = T_p + remaining / R_k``, ``C(k) = C_p + remaining / R_k * k * P``,
      ``remaining = total_samples - ctx.samples``, ``T_p`` the wall time since
      the start (agreed), ``P`` the price per worker-second. A
      :class:`~kungfu_tf.policy.StepUtility` without ``initial_time`` gets
      ``T0 = T(start size)`` at the first decision (its last bridge).

    A growth is asynchronous: after asking for ``k + K`` the job keeps
    training at ``k`` (those steps are not counted for anyone); if the
    cluster has not grown within ``grow_timeout_steps`` steps, ``k + K`` is
    recorded unreachable and the job settles. Sizes are bounded by
    ``min_size``/``max_size`` and the job's ``--min-np``/``--max-np``
    (``ctx.size_bounds``). The statistics per size, the direction and
    the settled size are in :meth:`state_dict`, so joiners and resumed runs
    continue the same search. Every decision and the statistics behind it
    are logged (``ctx.log``); the metrics ``autoscaling/throughput_at_<k>``,
    ``autoscaling/efficiency_<k>_<k2>`` and ``autoscaling/settled_size`` go to
    ``ctx.metrics`` (TensorBoard).

    Args:
        scale_by: K, workers added or removed per move.
        scale_every: N, steps measured per size.
        efficiency_threshold: S in [0, 1] (Or et al. evaluate with 0.1).
        min_size, max_size: the sizes the policy may choose.
        warmup_steps: steps skipped after a size change (after the first step
            at the new size, which is never counted).
        grow_timeout_steps: steps to wait for a requested growth.
        utility: ``U(completion_seconds) -> dollars``, non-increasing (checked
            by :func:`~kungfu_tf.policy.check_utility` over ``utility_horizon``).
        price_per_worker_hour: P in dollars per worker per hour (>= 0), with utility.
        total_samples: the job's total number of samples (global), with utility.

    Raises:
        ValueError: naming the argument and its value: K or N not positive,
            a threshold outside [0, 1], ``min_size > max_size``, a negative
            price, a utility that increases with time or returns a non-finite
            value, a utility without ``price_per_worker_hour`` or
            ``total_samples``; in ``before_train``: a runner without ``batch_size``.
    """

    prefix = "autoscaling"

    def __init__(
        self,
        *,
        scale_by: int = 1,
        scale_every: int = 10,
        efficiency_threshold: float = 0.1,
        min_size: int = 1,
        max_size: int | None = None,
        warmup_steps: int = 2,
        grow_timeout_steps: int = 1000,
        utility: Callable[[float], float] | None = None,
        price_per_worker_hour: float | None = None,
        total_samples: int | None = None,
        utility_horizon: float = DEFAULT_HORIZON,
    ):
        super().__init__("scale_every", scale_every, warmup_steps, grow_timeout_steps, min_size, max_size)
        self.search = ScalingSearch(scale_by)  # validates scale_by
        if isinstance(efficiency_threshold, bool) or not isinstance(efficiency_threshold, (int, float)) or not (
            0.0 <= float(efficiency_threshold) <= 1.0
        ):
            raise ValueError(f"AutoscalingPolicy: efficiency_threshold must be in [0, 1], got {efficiency_threshold!r}")
        self.scale_by = scale_by
        self.scale_every = scale_every
        self.efficiency_threshold = float(efficiency_threshold)
        self.utility = None if utility is None else check_utility(utility, utility_horizon)
        if utility is None and (price_per_worker_hour is not None or total_samples is not None):
            given = "price_per_worker_hour" if price_per_worker_hour is not None else "total_samples"
            raise ValueError(f"AutoscalingPolicy: {given} is only used with utility=, which is None")
        if utility is not None:
            if price_per_worker_hour is None:
                raise ValueError("AutoscalingPolicy: utility= needs price_per_worker_hour= (dollars per worker-hour, >= 0)")
            if total_samples is None:
                raise ValueError("AutoscalingPolicy: utility= needs total_samples= (the job's global samples, to "
                                 "estimate the remaining time)")  # fmt: skip
        if price_per_worker_hour is not None and (
            isinstance(price_per_worker_hour, bool)
            or not isinstance(price_per_worker_hour, (int, float))
            or not math.isfinite(price_per_worker_hour)
            or price_per_worker_hour < 0
        ):
            raise ValueError(f"AutoscalingPolicy: price_per_worker_hour must be a finite number >= 0, got {price_per_worker_hour!r}")
        if total_samples is not None and (isinstance(total_samples, bool) or not isinstance(total_samples, int) or total_samples <= 0):
            raise ValueError(f"AutoscalingPolicy: total_samples must be a positive int, got {total_samples!r}")
        self.price_per_worker_hour = None if price_per_worker_hour is None else float(price_per_worker_hour)
        self.total_samples = total_samples
        self.utility_horizon = utility_horizon
        self.initial_time: float | None = None  # a StepUtility's T0
        self.worker_seconds = 0.0  # C_p / P, counted at each decision
        self.last_elapsed = 0.0

    def config(self) -> dict[str, Any]:
        return {
            "scale_by": self.scale_by,
            "scale_every": self.scale_every,
            "efficiency_threshold": self.efficiency_threshold,
            "min_size": self.min_size,
            "max_size": self.max_size,
            "warmup_steps": self.measurement.warmup_steps,
            "grow_timeout_steps": self.measurement.grow_timeout_steps,
            "utility": None if self.utility is None else _describe(self.utility),
            "price_per_worker_hour": self.price_per_worker_hour,
            "total_samples": self.total_samples,
        }

    # --- decisions ----------------------------------------------------------------
    def condition(self, ctx: PolicyContext, elapsed: float, size: int) -> ThroughputCondition | UtilityCostCondition:
        """The scaling condition at this decision: utility vs cost when a utility was given, else throughput efficiency."""
        if self.utility is None:
            return ThroughputCondition(self.efficiency_threshold)
        assert self.total_samples is not None and self.price_per_worker_hour is not None
        remaining = max(float(self.total_samples - ctx.samples), 0.0)
        utility = self.utility
        if isinstance(utility, StepUtility) and utility.initial_time is None:
            if self.initial_time is None:  # T0: the completion time expected at the start size
                start = self.search.start if self.search.start is not None else size
                self.initial_time = elapsed + remaining / self.search.throughputs[start]
            utility = utility.with_initial_time(self.initial_time)
        price = self.price_per_worker_hour / 3600.0
        return UtilityCostCondition(utility, price, remaining, elapsed, past_cost=self.worker_seconds * price)

    def on_measured(self, ctx: PolicyContext, size: int, throughput: float, elapsed: float) -> None:
        self.worker_seconds += size * max(elapsed - self.last_elapsed, 0.0)
        self.last_elapsed = elapsed
        self.search.record(size, throughput)
        log_line(ctx, f"autoscaling: R_{size} = {throughput:.4g} samples/s (mean over {self.scale_every} steps and "
                      f"{size} workers, {elapsed:.1f} s since the start)")
        rates = self.search.throughputs
        cond = self.condition(ctx, elapsed, size)
        lo, hi = self.bounds(ctx)
        move = self.search.next_move(size, lo, hi, lambda a, b: cond.passes(a, rates[a], b, rates[b]))
        known = sorted(rates)
        for a, b in itertools.pairwise(known):
            log_line(ctx, f"autoscaling: {cond.explain(a, rates[a], b, rates[b])}")
        if move.settled:
            self.settle(ctx, move.target, move.why)
        else:
            self.move(ctx, move.target, move.why)

    def on_timeout(self, ctx: PolicyContext, target: int) -> None:
        self.search.mark_unreachable(target)
        rates = self.search.throughputs
        cond = self.condition(ctx, self.last_elapsed, ctx.size)
        lo, hi = self.bounds(ctx)
        size = self.search.settle_size(lo, self.search.upper(hi), lambda a, b: cond.passes(a, rates[a], b, rates[b]))
        self.settle(ctx, size, f"{target} workers unreachable within grow_timeout_steps={self.measurement.grow_timeout_steps}")

    def publish(self, ctx: PolicyContext) -> None:
        super().publish(ctx)
        rates = self.search.throughputs
        for k, r in sorted(rates.items()):
            ctx.metrics[f"autoscaling/throughput_at_{k}"] = r
        known = sorted(rates)
        for a, b in itertools.pairwise(known):
            if rates[a] > 0:
                ctx.metrics[f"autoscaling/efficiency_{a}_{b}"] = scaling_efficiency(a, rates[a], b, rates[b])

    # --- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(search=self.search.state_dict(), initial_time=self.initial_time,
                     worker_seconds=self.worker_seconds, last_elapsed=self.last_elapsed)  # fmt: skip
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.search.load_state_dict(state.get("search", {}))
        self.initial_time = state.get("initial_time")
        self.worker_seconds = float(state.get("worker_seconds", 0.0))
        self.last_elapsed = float(state.get("last_elapsed", 0.0))


def _describe(fn: Callable[[float], float]) -> str:
    """The same text on every worker: the built-in utilities' repr; a plain callable's name (its repr holds an address)."""
    if isinstance(fn, (LinearUtility, ConcaveUtility, StepUtility)):
        return repr(fn)
    name = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"{getattr(fn, '__module__', type(fn).__module__)}.{name}"
