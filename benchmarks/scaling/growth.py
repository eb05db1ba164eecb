"""Growth of a measured quantity with the number of workers, and what it predicts.

A power law y = c · n^k through the points by least squares on log y against
log n: k ≈ 1 is linear growth, k ≈ 2 quadratic, k ≈ 0 constant (a log n term
shows as a small k). Used to extrapolate the runtime's per-worker resources
and latencies from 32–128 simulated workers to 1,024.

Example:
    >>> fit = fit_power([32, 64, 128], [66.0, 130.0, 258.0])
    >>> round(fit.exponent, 2), round(fit.predict(1024))
    (0.98, 1992)
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class PowerFit:
    """y ≈ coefficient · n^exponent, from the points it was fitted to."""

    coefficient: float
    exponent: float

    def predict(self, n: float) -> float:
        """The fitted value at n workers."""
        return self.coefficient * n**self.exponent


def fit_power(ns: list[int], ys: list[float]) -> PowerFit:
    """Least-squares power law through (n, y); needs two points with y > 0.

    Example:
        >>> fit_power([2, 4], [3.0, 12.0]).exponent
        2.0
    """
    pts = [(math.log(n), math.log(y)) for n, y in zip(ns, ys) if n > 0 and y > 0]
    if len(pts) < 2:
        raise ValueError(f"need two positive points to fit a power law, got {list(zip(ns, ys))}")
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        raise ValueError(f"need two different worker counts, got {ns}")
    k = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return PowerFit(math.exp(my - k * mx), k)
