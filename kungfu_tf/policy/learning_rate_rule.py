"""How the learning rate follows a batch-size change: "linear", "sqrt" or "adascale".

Example:
    >>> from kungfu_tf.policy.learning_rate_rule import scaled_learning_rate
    >>> scaled_learning_rate("linear", 0.1, 64, 128)
    0.2
    >>> round(scaled_learning_rate("sqrt", 0.1, 64, 256), 6)
    0.2
"""

from __future__ import annotations

import math
from collections.abc import Mapping

LR_RULES = ("linear", "sqrt", "adascale")


def check_rule(rule: str | None) -> str | None:
    """``rule`` if it is None or one of :data:`LR_RULES`, else ValueError naming it."""
    if rule is not None and rule not in LR_RULES:
        raise ValueError(f"lr_rule must be one of {', '.join(LR_RULES)} or None, got {rule!r}")
    return rule


def scaled_learning_rate(
    rule: str, lr: float, old_batch: int, new_batch: int, metrics: Mapping[str, object] | None = None
) -> float:
    """The learning rate after the global batch changes from ``old_batch`` to ``new_batch``.

    The rule scales the current rate ``lr`` (so it composes with schedules
    and explicit ``set_learning_rate`` calls):

    * ``"linear"``: ``lr * new/old`` (Goyal et al.);
    * ``"sqrt"``: ``lr * sqrt(new/old)`` (Krizhevsky; Hoffer et al.);
    * ``"adascale"``: AdaScale's gain (Johnson et al., 2020). With the
      per-sample gradient noise ``tr(Σ)`` (``metrics["noise_trace"]``) and
      the squared true gradient ``|G|²`` (``metrics["grad_sq_norm"]``), the
      gain of batch B over the base batch B0 is
      ``(tr(Σ)/B0 + |G|²) / (tr(Σ)/B + |G|²)``; the ratio of two gains, the
      factor applied here, is ``(tr(Σ)/old + |G|²) / (tr(Σ)/new + |G|²)``
      (B0 cancels). It lies between 1 and ``new/old``: linear scaling while
      noise dominates, none once the gradient is exact.

      Both statistics are the monitor's unbiased estimates, which can come
      out negative when the noise swamps them; a negative estimate counts
      as 0 (a zero ``tr(Σ)`` gives factor 1, a zero ``|G|²`` linear
      scaling; both zero: the rate is kept). Unlike AdaScale, which applies
      its gain at every step, the runner applies this factor once per
      batch-size change, from the smoothed statistics at that moment; the
      rate then stays until the next change (or an explicit
      ``set_learning_rate``).

    Raises:
        ValueError: an unknown rule; for "adascale", missing or non-finite
            statistics (no monitor, or no monitored step yet).
    """
    check_rule(rule)
    ratio = new_batch / old_batch
    if rule == "linear":
        return lr * ratio
    if rule == "sqrt":
        return lr * math.sqrt(ratio)
    trace = _statistic(metrics, "noise_trace")
    grad_sq = _statistic(metrics, "grad_sq_norm")
    if trace == 0 and grad_sq == 0:
        return lr  # no information on either: keep the rate
    return lr * (trace / old_batch + grad_sq) / (trace / new_batch + grad_sq)


def _statistic(metrics: Mapping[str, object] | None, name: str) -> float:
    value = None if metrics is None else metrics.get(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(
            f"lr_rule='adascale' needs the GradientMonitor's {name!r} (a finite number), got {value!r}: "
            "pass a monitor and change the batch size only after a monitored step"
        )
    # An unbiased estimate of a non-negative quantity can be negative: clamp.
    return max(0.0, float(value))
