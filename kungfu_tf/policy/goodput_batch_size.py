"""``GoodputBatchSizePolicy``: the global batch that maximises measured throughput x statistical efficiency.

Example:
    >>> from kungfu_tf.policy import GoodputBatchSizePolicy
    >>> policy = GoodputBatchSizePolicy(max_batch_size=1024, min_batch_size=64, every=20, round_to=16)
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.goodput import StepTimeModel, statistical_efficiency
from kungfu_tf.policy.periodic_policy import PeriodicPolicy


class GoodputBatchSizePolicy(PeriodicPolicy):
    """Every ``every`` steps, moves the global batch to the one with the highest predicted goodput.

    Goodput = throughput(B) x efficiency(B) (Pollux, Qiao et al. 2021; see
    :mod:`kungfu_tf.policy.goodput`). The throughput is *measured*: the
    wall time of each interval of ``every`` steps, averaged over the
    workers, is one sample of the step time at the batch in force; the
    median of the last ``window`` samples per batch feeds the fitted model
    ``t(B) = fixed + per_sample * B``. The efficiency
    ``(B_noise + B0) / (B_noise + B)`` takes ``B_noise`` from the monitor's
    smoothed gradient noise scale (``metric``, B_simple, which Taming the
    Noise §4 shows to be a good proxy), so the chosen batch grows as the
    noise scale grows. Use it with ``lr_rule="adascale"`` on the runner
    (AdaScale's gain from the same statistics) or ``"sqrt"``.

    At the start only one batch has been measured, and the model cannot
    tell fixed from per-sample cost: the policy then tries the doubled
    batch if it would pay even at the same step time as today
    (``2 * E(2B) / E(B) >= min_gain``). From two measured batches on it
    picks the best multiple of ``size * round_to`` in
    ``[min_batch_size, max_batch_size]``, never beyond
    ``max_extrapolation`` times the largest batch measured (a linear model
    should not be trusted far from its data), and moves only when the
    prediction beats the current batch by ``min_gain`` (hysteresis; the
    runner's :class:`~kungfu_tf.policy.Hysteresis` applies too). It may
    shrink the batch when that predicts better, but never below
    ``min_batch_size``. An interval in which the batch or the cluster size
    changed is not measured; a cluster-size change forgets the step times
    (each depends on the per-worker batch). Every input is agreed (all-
    reduced times, all-reduced statistics), so all workers decide alike.

    Args:
        max_batch_size: the largest global batch.
        min_batch_size: the smallest (default: ``size * round_to``); also
            the base batch ``B0`` of the reported efficiency.
        every: steps per measurement interval and decision (>= 2).
        round_to: per-worker batches are multiples of this (pass the same
            number as ``adaptive_batch(granularity=...)``).
        min_gain: the predicted goodput ratio needed to move (> 1).
        max_extrapolation: how far beyond the largest measured batch the
            policy may go in one move (> 1).
        window: measured intervals kept per batch.
        metric: the monitor's noise scale (default ``"gns"``).

    Puts ``goodput/efficiency``, ``goodput/predicted_gain`` and
    ``goodput/best_batch`` into ``ctx.metrics`` after each decision.

    Example:
        >>> import kungfu_tf.keras as kfk
        >>> from kungfu_tf.policy import GoodputBatchSizePolicy
        >>> cb = kfk.PolicyCallback([GoodputBatchSizePolicy(max_batch_size=1024, min_batch_size=64)],
        ...                         batch_size=64, lr_rule="adascale")  # doctest: +SKIP
    """

    needs_monitor = True
    unit = "step"

    def __init__(
        self,
        max_batch_size: int,
        min_batch_size: int | None = None,
        every: int = 20,
        round_to: int = 1,
        min_gain: float = 1.1,
        max_extrapolation: float = 2.0,
        window: int = 5,
        metric: str = "gns",
    ):
        for name, value in (("max_batch_size", max_batch_size), ("round_to", round_to), ("window", window)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GoodputBatchSizePolicy: {name} must be a positive int, got {value!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 2:
            raise ValueError(f"GoodputBatchSizePolicy: every must be an int >= 2, got {every!r}")
        if min_batch_size is not None and (
            isinstance(min_batch_size, bool) or not isinstance(min_batch_size, int)
            or not 0 < min_batch_size <= max_batch_size
        ):  # fmt: skip
            raise ValueError(
                f"GoodputBatchSizePolicy: min_batch_size must be an int in [1, max_batch_size={max_batch_size}], "
                f"got {min_batch_size!r}"
            )
        for name, number in (("min_gain", min_gain), ("max_extrapolation", max_extrapolation)):
            if isinstance(number, bool) or not isinstance(number, (int, float)) or not number > 1:
                raise ValueError(f"GoodputBatchSizePolicy: {name} must be a number > 1, got {number!r}")
        self.max_batch_size = max_batch_size
        self.min_batch_size = min_batch_size
        self.every = every
        self.round_to = round_to
        self.min_gain = float(min_gain)
        self.max_extrapolation = float(max_extrapolation)
        self.window = window
        self.metric = metric
        self.step_times: dict[int, list[float]] = {}  # global batch -> agreed seconds per step, latest last
        self.measured_size: int | None = None  # the cluster size the step times belong to
        self._mark: tuple[int, int | None, int, float] | None = None  # (step, batch, size, time): local only

    def config(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "min_batch_size": self.min_batch_size, "every": self.every,
                "round_to": self.round_to, "min_gain": self.min_gain, "max_extrapolation": self.max_extrapolation,
                "window": self.window, "metric": self.metric}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        # The measurements are agreed values: a joiner (or a resumed run) continues from them.
        return {"step_times": {str(b): list(ts) for b, ts in self.step_times.items()},
                "measured_size": self.measured_size}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_times = {int(b): [float(t) for t in ts] for b, ts in state.get("step_times", {}).items()}
        self.measured_size = state.get("measured_size")
        self._mark = None  # a joiner's clock starts at its first check

    # --- one decision ------------------------------------------------------------
    def check(self, ctx: PolicyContext) -> None:
        batch = ctx.batch_size
        if batch is None:
            raise ValueError("GoodputBatchSizePolicy needs the global batch size: pass batch_size= to the runner")
        self._measure(ctx, batch)
        noise = ctx.metrics.get(self.metric)
        if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not math.isfinite(noise):
            return  # no estimate yet
        times = {b: statistics.median(ts) for b, ts in self.step_times.items()}
        if batch not in times:
            return  # the current batch is not measured yet
        unit = ctx.size * self.round_to
        low = _round_up(self.min_batch_size or unit, unit)
        high = self.max_batch_size // unit * unit
        base = self.min_batch_size or low
        model = StepTimeModel.fit(times)
        if model is None:
            self._explore(ctx, batch, noise, base, unit, high)
            return
        reach = min(high, int(max(times) * self.max_extrapolation))
        candidates = list(range(low, reach + 1, unit)) or [batch]
        best = max(candidates, key=lambda b: model.goodput(b, noise, base))
        gain = model.goodput(best, noise, base) / model.goodput(batch, noise, base)
        self._publish(ctx, batch, noise, base, gain, best)
        if best != batch and gain >= self.min_gain:
            ctx.set_batch_size(best, reason=f"predicted goodput x{gain:.3g} at {self.metric} {noise:.4g} "
                                            f"(step time {1000 * model.fixed:.3g} ms + {1e6 * model.per_sample:.3g} µs/sample)")  # fmt: skip

    def _measure(self, ctx: PolicyContext, batch: int) -> None:
        """Adds the agreed seconds per step of the interval since the last check, if one batch and size held."""
        now = time.perf_counter()
        local = math.nan
        if self._mark is not None and self._mark[1:3] == (batch, ctx.size) and ctx.step > self._mark[0]:
            local = (now - self._mark[3]) / (ctx.step - self._mark[0])
        self._mark = (ctx.step, batch, ctx.size, now)
        measured = math.isfinite(local)
        total, fraction = ctx.all_reduce([local if measured else 0.0, float(measured)], op="mean",
                                         name="kungfu_policy/goodput/step_time")  # fmt: skip
        if ctx.size != self.measured_size:
            self.step_times, self.measured_size = {}, ctx.size  # the per-worker batches changed: measure anew
        if fraction < 1:
            return  # a worker that just joined (or the first interval): no complete measurement
        kept = self.step_times.setdefault(batch, [])
        kept.append(float(total))
        del kept[: -self.window]

    def _explore(self, ctx: PolicyContext, batch: int, noise: float, base: int, unit: int, high: int) -> None:
        """One batch measured: try the doubled batch if it pays even at today's step time."""
        target = min(high, _round_up(2 * batch, unit))
        if target <= batch:
            return
        gain = target / batch * statistical_efficiency(target, noise, base) / statistical_efficiency(batch, noise, base)
        self._publish(ctx, batch, noise, base, gain, target)
        if gain >= self.min_gain:
            ctx.set_batch_size(target, reason=f"exploring: x{gain:.3g} at {self.metric} {noise:.4g} if the step time holds")

    @staticmethod
    def _publish(ctx: PolicyContext, batch: int, noise: float, base: int, gain: float, best: int) -> None:
        ctx.metrics["goodput/efficiency"] = statistical_efficiency(batch, noise, base)
        ctx.metrics["goodput/predicted_gain"] = gain
        ctx.metrics["goodput/best_batch"] = best


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit
