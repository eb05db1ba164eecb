"""Goodput of a global batch size: measured throughput times statistical efficiency (Pollux; McCandlish et al.).

Training progress per second at global batch ``B`` is the product of two
factors. The *throughput* ``B / t(B)`` (samples per second) grows with
``B`` while a fixed per-step cost (communication latency, dispatch) is
amortised. The *statistical efficiency* — progress per sample at ``B``
relative to a base batch ``B0`` — falls once ``B`` passes the gradient
noise scale ``B_noise``: a step at ``B`` makes about ``B / (1 + B/B_noise)``
samples' worth of progress (McCandlish et al., Eq. 2.7), so

    E(B) = (B_noise + B0) / (B_noise + B).

Goodput ``B / t(B) * E(B)`` has one maximum, which moves to larger batches
as the noise scale grows during training (Pollux, §3.1). The step time is
modelled as ``t(B) = fixed + per_sample * B``, fitted to the step times
measured at the batches tried so far.

Example:
    >>> from kungfu_tf.policy.goodput import StepTimeModel, statistical_efficiency
    >>> statistical_efficiency(64, noise_scale=64, base_batch=64)
    1.0
    >>> statistical_efficiency(192, noise_scale=64, base_batch=64)
    0.5
    >>> model = StepTimeModel.fit({64: 0.020, 256: 0.026})  # 18 ms fixed + 31.25 µs per sample
    >>> round(model.step_time(1024), 4)
    0.05
    >>> round(model.goodput(256, noise_scale=500, base_batch=64) / model.goodput(64, noise_scale=500, base_batch=64), 2)
    2.3
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


def statistical_efficiency(batch: float, noise_scale: float, base_batch: float) -> float:
    """``(B_noise + B0) / (B_noise + B)``: progress per sample at ``batch`` relative to ``base_batch``.

    1 at the base batch; ``B0 / B`` (no gain from the larger batch) when the
    noise scale is 0; tends to 1 when the noise scale is much larger than both.
    """
    if not batch > 0 or not base_batch > 0:
        raise ValueError(f"statistical_efficiency: batch sizes must be > 0, got {batch!r} and {base_batch!r}")
    noise = max(0.0, float(noise_scale))  # an unbiased estimate can come out negative: no noise
    return (noise + base_batch) / (noise + batch)


@dataclass(frozen=True)
class StepTimeModel:
    """``t(B) = fixed + per_sample * B`` seconds per step, both terms >= 0."""

    fixed: float
    per_sample: float

    @classmethod
    def fit(cls, step_times: Mapping[int, float]) -> StepTimeModel | None:
        """Least squares over ``{batch: seconds per step}``; None below two distinct batches.

        A fit with a negative term (noise on two nearby batches) keeps the
        other term only: all fixed cost if the slope came out negative, all
        per-sample cost if the intercept did.
        """
        points = [(float(b), float(t)) for b, t in step_times.items() if b > 0 and math.isfinite(t) and t > 0]
        if len({b for b, _ in points}) < 2:
            return None
        n = len(points)
        mean_b = sum(b for b, _ in points) / n
        mean_t = sum(t for _, t in points) / n
        var_b = sum((b - mean_b) ** 2 for b, _ in points)
        slope = sum((b - mean_b) * (t - mean_t) for b, t in points) / var_b
        intercept = mean_t - slope * mean_b
        if slope < 0:
            return cls(fixed=mean_t, per_sample=0.0)
        if intercept < 0:
            return cls(fixed=0.0, per_sample=sum(t for _, t in points) / sum(b for b, _ in points))
        return cls(fixed=intercept, per_sample=slope)

    def step_time(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch

    def throughput(self, batch: float) -> float:
        """Samples per second at ``batch``."""
        return batch / self.step_time(batch)

    def goodput(self, batch: float, noise_scale: float, base_batch: float) -> float:
        """Throughput times statistical efficiency: base-batch samples' worth of progress per second."""
        return self.throughput(batch) * statistical_efficiency(batch, noise_scale, base_batch)
