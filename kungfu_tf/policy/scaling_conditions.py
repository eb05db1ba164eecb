"""Scaling conditions (Or et al. §4.2): is growing the cluster from ``k`` to ``k + d`` workers worth it?

Both compare two cluster sizes by their aggregate throughputs ``R_k``
(samples/s, measured); :class:`~kungfu_tf.policy.scaling_search.ScalingSearch`
asks them about neighbouring sizes.

Example:
    >>> from kungfu_tf.policy.scaling_conditions import ThroughputCondition, scaling_efficiency
    >>> scaling_efficiency(4, 400.0, 5, 450.0)   # the paper's R_4 = 400, R_5 = 450
    0.5
    >>> ThroughputCondition(threshold=0.6).passes(4, 400.0, 5, 450.0)
    False
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def scaling_efficiency(k: int, r_k: float, k2: int, r_k2: float) -> float:
    """``s_{k,d} = ((R_{k+d} - R_k) / d) / (R_k / k)`` with ``d = k2 - k`` (§4.2.1).

    1 when each added worker contributes as much as each existing one,
    0 when the throughput does not grow, negative when it drops.
    """
    if k2 <= k or k <= 0:
        raise ValueError(f"scaling_efficiency: need 0 < k < k2, got k={k}, k2={k2}")
    if r_k <= 0:
        raise ValueError(f"scaling_efficiency: the throughput at {k} workers must be > 0, got {r_k!r}")
    return ((r_k2 - r_k) / (k2 - k)) / (r_k / k)


@dataclass(frozen=True)
class ThroughputCondition:
    """``s_{k,d} > threshold`` (§4.2.1; ``threshold`` is S in [0, 1])."""

    threshold: float

    def passes(self, k: int, r_k: float, k2: int, r_k2: float) -> bool:
        return scaling_efficiency(k, r_k, k2, r_k2) > self.threshold

    def explain(self, k: int, r_k: float, k2: int, r_k2: float) -> str:
        s = scaling_efficiency(k, r_k, k2, r_k2)
        verdict = ">" if s > self.threshold else "<="
        return f"efficiency s({k}->{k2}) = {s:.3f} {verdict} S = {self.threshold:g}"


@dataclass(frozen=True)
class UtilityCostCondition:
    """Marginal utility > marginal cost (§4.2.2): ``U(T(k2)) - U(T(k)) > C(k2) - C(k)``.

    With ``remaining`` samples left at the decision:
    ``T(k) = elapsed + remaining / R_k`` (seconds) and
    ``C(k) = past_cost + remaining / R_k * k * price_per_second`` (dollars;
    the paper's ``C_p + t_k * b * k * P``). ``past_cost`` cancels in the
    difference; it is kept for the log.

    Example:
        >>> from kungfu_tf.policy.utility import LinearUtility
        >>> c = UtilityCostCondition(LinearUtility(100.0, 1000.0), price_per_second=0.01,
        ...                          remaining=1000.0, elapsed=0.0)
        >>> c.completion_time(1, 10.0), c.cost(1, 10.0)     # 100 s, 1 worker
        (100.0, 1.0)
        >>> c.passes(1, 10.0, 2, 20.0)   # U: 90 -> 95 (+5); C: 1 -> 1 (+0)
        True
    """

    utility: Callable[[float], float]
    price_per_second: float
    remaining: float
    elapsed: float
    past_cost: float = 0.0

    def completion_time(self, k: int, r_k: float) -> float:
        return self.elapsed + self.remaining / r_k

    def cost(self, k: int, r_k: float) -> float:
        return self.past_cost + self.remaining / r_k * k * self.price_per_second

    def margins(self, k: int, r_k: float, k2: int, r_k2: float) -> tuple[float, float]:
        """(marginal utility, marginal cost) of going from ``k`` to ``k2`` workers."""
        gain = float(self.utility(self.completion_time(k2, r_k2))) - float(self.utility(self.completion_time(k, r_k)))
        return gain, self.cost(k2, r_k2) - self.cost(k, r_k)

    def passes(self, k: int, r_k: float, k2: int, r_k2: float) -> bool:
        gain, extra = self.margins(k, r_k, k2, r_k2)
        return gain > extra

    def explain(self, k: int, r_k: float, k2: int, r_k2: float) -> str:
        gain, extra = self.margins(k, r_k, k2, r_k2)
        verdict = ">" if gain > extra else "<="
        return (
            f"utility {k}->{k2}: T {self.completion_time(k, r_k):.1f} s -> {self.completion_time(k2, r_k2):.1f} s, "
            f"marginal utility ${gain:.4g} {verdict} marginal cost ${extra:.4g}"
        )
