"""Utility functions of a job's completion time (Or et al. §4.2.2, Fig. 5): what finishing after T seconds is worth.

``AutoscalingPolicy(utility=..., price_per_worker_hour=...)`` adds a worker
only while the utility it gains (a shorter completion time) exceeds what it
costs. A utility is any callable ``U(T)`` of the completion time in seconds
returning dollars that never increases with ``T`` (a rational user prefers
shorter completion times); :func:`check_utility` checks that.

Example:
    >>> from kungfu_tf.policy import LinearUtility, StepUtility, check_utility
    >>> LinearUtility(value=100.0, deadline=3600.0)(1800.0)
    50.0
    >>> u = StepUtility(steps=[(3600.0, 100.0)], late_value=20.0, initial_time=7200.0)
    >>> u(1800.0), u(5400.0), u(9000.0)   # the drop at 1 h is bridged by a line to (T0, 20)
    (100.0, 60.0, 20.0)
    >>> check_utility(lambda t: t, horizon=10.0)
    Traceback (most recent call last):
    ...
    ValueError: utility must not increase with the completion time: U(0 s) = 0 < U(0.001 s) = 0.001
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

# check_utility's default horizon: 30 days.
DEFAULT_HORIZON = 30 * 24 * 3600.0


def _positive(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{owner}: {name} must be a finite number > 0, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{owner}: {name} must be a finite number > 0, got {value!r}")
    return v


def _finite(owner: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{owner}: {name} must be a finite number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{owner}: {name} must be a finite number, got {value!r}")
    return v


class LinearUtility:
    """``U(T) = value * (1 - T / deadline)``: a constant gain per second saved (Fig. 5a).

    ``value`` dollars for an instant job, 0 at ``deadline`` seconds, negative after.

    Example:
        >>> u = LinearUtility(value=10.0, deadline=100.0)
        >>> u(0.0), u(25.0), u(100.0)
        (10.0, 7.5, 0.0)
    """

    def __init__(self, value: float, deadline: float):
        self.value = _positive("LinearUtility", "value", value)
        self.deadline = _positive("LinearUtility", "deadline", deadline)

    def __call__(self, completion_time: float) -> float:
        return self.value * (1.0 - completion_time / self.deadline)

    def __repr__(self) -> str:
        return f"LinearUtility(value={self.value!r}, deadline={self.deadline!r})"


class ConcaveUtility:
    """``U(T) = value * (1 - (T / deadline) ** power)``, ``power > 1``: concave down (Fig. 5b).

    Decreasing and concave for ``T >= 0``: the gain of saving a second grows
    with ``T`` (``|U'(T)| = value * power * T**(power-1) / deadline**power``),
    so shortening a long job is worth much, shortening a short one little.
    ``value`` at ``T = 0``, 0 at ``deadline``, negative after.

    Example:
        >>> u = ConcaveUtility(value=100.0, deadline=10.0, power=2)
        >>> u(0.0), u(5.0), u(10.0)
        (100.0, 75.0, 0.0)
    """

    def __init__(self, value: float, deadline: float, power: float = 2.0):
        self.value = _positive("ConcaveUtility", "value", value)
        self.deadline = _positive("ConcaveUtility", "deadline", deadline)
        p = _finite("ConcaveUtility", "power", power)
        if p <= 1:
            raise ValueError(f"ConcaveUtility: power must be > 1 (1 is LinearUtility; < 1 is convex), got {power!r}")
        self.power = p

    def __call__(self, completion_time: float) -> float:
        t = max(float(completion_time), 0.0)
        return self.value * (1.0 - (t / self.deadline) ** self.power)

    def __repr__(self) -> str:
        return f"ConcaveUtility(value={self.value!r}, deadline={self.deadline!r}, power={self.power!r})"


class StepUtility:
    """Target completion times (Fig. 5c): ``steps=[(T1, v1), (T2, v2), ...]`` is worth ``v1`` if done by ``T1``,
    ``v2`` if done by ``T2``, ..., ``late_value`` after the last deadline; with §4.2.2's bridges.

    The raw step function (:meth:`raw`) is flat between deadlines, so a worker
    that shortens the job without crossing a deadline gains nothing and the
    marginal-utility condition could never move the job to a higher step.
    Or et al. therefore replace each gap by "a line that begins at the
    rightmost point of the higher step (T1) and ends at either the rightmost
    point of the lower step (in the case of 3 or more steps) or the initial
    T (T0)". Our reading, which ``__call__`` implements:

    * the higher step ``[0, T1]`` stays flat at ``v1``;
    * the drop at ``T_i`` becomes the segment from ``(T_i, v_i)`` to the
      rightmost point of the step below, ``(T_{i+1}, v_{i+1})``: with three or
      more levels the middle steps are replaced by lines entirely;
    * the lowest step (``late_value``, after the last deadline ``T_n``) has
      no rightmost point: its drop is bridged from ``(T_n, v_n)`` to
      ``(T0, late_value)``, ``T0 = initial_time``, the completion time the
      job was expected to have when it started (``AutoscalingPolicy`` sets it
      from its first measurement, :meth:`with_initial_time`); flat after ``T0``.
      Without ``initial_time``, or with ``T0 <= T_n``, that drop stays a jump.

    Args:
        steps: ``(deadline_seconds, value_dollars)`` pairs, deadlines strictly
            increasing, values strictly decreasing.
        late_value: the utility after the last deadline (default 0; at most
            the last value).
        initial_time: ``T0`` in seconds, or None.

    Example:
        >>> u = StepUtility(steps=[(10.0, 100.0), (20.0, 50.0)], late_value=0.0, initial_time=40.0)
        >>> [u(t) for t in (5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0)]
        [100.0, 100.0, 75.0, 50.0, 25.0, 0.0, 0.0]
        >>> [u.raw(t) for t in (5.0, 15.0, 30.0)]
        [100.0, 50.0, 0.0]
    """

    def __init__(
        self,
        steps: Sequence[tuple[float, float]],
        late_value: float = 0.0,
        initial_time: float | None = None,
    ):
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence) or not steps:
            raise ValueError(f"StepUtility: steps must be a non-empty list of (deadline, value) pairs, got {steps!r}")
        parsed: list[tuple[float, float]] = []
        for i, pair in enumerate(steps):
            if not isinstance(pair, Sequence) or isinstance(pair, (str, bytes)) or len(pair) != 2:
                raise ValueError(f"StepUtility: steps[{i}] must be a (deadline, value) pair, got {pair!r}")
            deadline = _positive("StepUtility", f"steps[{i}] deadline", pair[0])
            value = _finite("StepUtility", f"steps[{i}] value", pair[1])
            if parsed and deadline <= parsed[-1][0]:
                raise ValueError(
                    f"StepUtility: deadlines must increase: steps[{i}] deadline {deadline!r} <= steps[{i - 1}] "
                    f"deadline {parsed[-1][0]!r}"
                )
            if parsed and value >= parsed[-1][1]:
                raise ValueError(
                    f"StepUtility: values must decrease (utility never increases with time): steps[{i}] value "
                    f"{value!r} >= steps[{i - 1}] value {parsed[-1][1]!r}"
                )
            parsed.append((deadline, value))
        late = _finite("StepUtility", "late_value", late_value)
        if late > parsed[-1][1]:
            raise ValueError(
                f"StepUtility: late_value {late!r} exceeds the last step's value {parsed[-1][1]!r} "
                "(utility never increases with time)"
            )
        self.steps = parsed
        self.late_value = late
        self.initial_time = None if initial_time is None else _positive("StepUtility", "initial_time", initial_time)

    def with_initial_time(self, initial_time: float) -> StepUtility:
        """The same steps, bridged to ``(initial_time, late_value)`` at the end."""
        return StepUtility(self.steps, self.late_value, initial_time)

    def raw(self, completion_time: float) -> float:
        """The step function as given, without bridges."""
        for deadline, value in self.steps:
            if completion_time <= deadline:
                return value
        return self.late_value

    def knots(self) -> list[tuple[float, float]]:
        """The corners of the bridged function: flat before the first, linear between, flat after the last."""
        points = list(self.steps)
        last_deadline = points[-1][0]
        if self.initial_time is not None and self.initial_time > last_deadline:
            points.append((self.initial_time, self.late_value))
        return points

    def __call__(self, completion_time: float) -> float:
        t = float(completion_time)
        points = self.knots()
        if t <= points[0][0]:
            return points[0][1]
        for (t0, v0), (t1, v1) in itertools.pairwise(points):
            if t <= t1:
                return v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return self.late_value

    def __repr__(self) -> str:
        return f"StepUtility(steps={self.steps!r}, late_value={self.late_value!r}, initial_time={self.initial_time!r})"


def check_utility(fn: Callable[[float], float], horizon: float = DEFAULT_HORIZON, points: int = 257) -> Callable[[float], float]:
    """Returns ``fn`` if it is a utility: a finite real number for every completion time in ``[0, horizon]``
    seconds that never increases with the time; raises ``ValueError`` naming the times and values otherwise.

    Sampled at ``points`` evenly spaced times and as many spaced geometrically
    from 1 ms (so a short job's range is seen too); a relative tolerance of
    1e-12 allows rounding.

    Example:
        >>> check_utility(LinearUtility(value=1.0, deadline=60.0), horizon=600.0)
        LinearUtility(value=1.0, deadline=60.0)
        >>> check_utility(lambda t: float("nan"), horizon=1.0)
        Traceback (most recent call last):
        ...
        ValueError: utility must return a finite number, got U(0 s) = nan
    """
    if not callable(fn):
        raise TypeError(f"utility must be a callable U(completion_time_seconds) -> dollars, got {fn!r}")
    h = _positive("check_utility", "horizon", horizon)
    if isinstance(points, bool) or not isinstance(points, int) or points < 2:
        raise ValueError(f"check_utility: points must be an int >= 2, got {points!r}")
    times = np.union1d(np.linspace(0.0, h, points), np.geomspace(min(1e-3, h), h, points))
    previous: tuple[float, float] | None = None
    for t in times.tolist():
        try:
            raw = fn(t)
        except Exception as e:  # named and re-raised as the cause
            raise ValueError(f"utility raised at U({t:g} s): {type(e).__name__}: {e}") from e
        if isinstance(raw, bool) or not isinstance(raw, (int, float, np.integer, np.floating)):
            raise ValueError(f"utility must return a real number (dollars), got U({t:g} s) = {raw!r}")  # noqa: TRY004 -- a bad utility is a bad value
        value = float(raw)
        if not math.isfinite(value):
            raise ValueError(f"utility must return a finite number, got U({t:g} s) = {value!r}")
        if previous is not None and value > previous[1] + 1e-12 * max(1.0, abs(previous[1])):
            raise ValueError(
                f"utility must not increase with the completion time: U({previous[0]:g} s) = {previous[1]:g} "
                f"< U({t:g} s) = {value:g}"
            )
        previous = (t, value)
    return fn
