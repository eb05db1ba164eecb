"""``GNSBatchSizePolicy``: grow the batch with the gradient noise scale (KungFu §6.2 (1), Taming §4).

Example:
    >>> from kungfu_tf.policy import GNSBatchSizePolicy
    >>> policy = GNSBatchSizePolicy(max_batch_size=4096, threshold=1.5, every=10, unit="epoch")
"""

from __future__ import annotations

import math
from typing import Any

from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.periodic_policy import PeriodicPolicy

UNITS = ("step", "epoch")


class GNSBatchSizePolicy(PeriodicPolicy):
    """Scales the global batch by ``r`` when the smoothed GNS has grown by ``r >= threshold``.

    The gradient noise scale ``B_simple = tr(Σ)/|G|²`` estimates the batch size
    beyond which larger batches stop helping (McCandlish et al.). It grows
    as training proceeds; KungFu's policy follows it: every ``every`` steps
    (or epochs), with ``g`` the monitor's smoothed ``gns`` and ``g0`` its
    value when the batch last changed (or at the first check), if
    ``r = g / g0 >= threshold`` the global batch becomes
    ``min(max_batch_size, B * r)``, rounded down to a multiple of
    ``size * round_to`` (per-worker batches stay multiples of ``round_to``:
    pass the same number as ``adaptive_batch(granularity=...)``). It never
    shrinks the batch. The GNS is computed from all-reduced statistics, so
    every worker takes the same decision.

    Args:
        max_batch_size: the largest global batch (KungFu: 4096).
        threshold: the smallest growth factor that triggers a change (> 1).
        every: check every this many steps or epochs.
        unit: "step" or "epoch".
        round_to: per-worker batches are multiples of this.
        metric: the metric followed (default "gns").

    Example:
        >>> import keras
        >>> import kungfu_tf.keras as kfk
        >>> from kungfu_tf.policy import GNSBatchSizePolicy
        >>> cb = kfk.PolicyCallback([GNSBatchSizePolicy(max_batch_size=1024, every=50)],
        ...                         batch_size=64, lr_rule="sqrt")  # doctest: +SKIP
    """

    needs_monitor = True

    def __init__(
        self,
        max_batch_size: int,
        threshold: float = 1.5,
        every: int = 100,
        unit: str = "step",
        round_to: int = 1,
        metric: str = "gns",
    ):
        for name, value in (("max_batch_size", max_batch_size), ("every", every), ("round_to", round_to)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"GNSBatchSizePolicy: {name} must be a positive int, got {value!r}")
        if not isinstance(threshold, (int, float)) or not threshold > 1:
            raise ValueError(f"GNSBatchSizePolicy: threshold must be a number > 1, got {threshold!r}")
        if unit not in UNITS:
            raise ValueError(f"GNSBatchSizePolicy: unit must be one of {', '.join(UNITS)}, got {unit!r}")
        self.max_batch_size = max_batch_size
        self.threshold = float(threshold)
        self.every = every
        self.unit = unit
        self.round_to = round_to
        self.metric = metric
        self.reference: float | None = None  # the GNS when the batch last changed
        self._reference_batch: int | None = None
        self._requested: tuple[int, float] | None = None  # (batch, gns) of our pending request

    def config(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "threshold": self.threshold, "every": self.every,
                "unit": self.unit, "round_to": self.round_to, "metric": self.metric}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        # The reference GNS (and the batch it belongs to): a resumed run measures growth from it.
        return {"reference": self.reference, "reference_batch": self._reference_batch,
                "requested": None if self._requested is None else list(self._requested)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reference = state.get("reference")
        self._reference_batch = state.get("reference_batch")
        requested = state.get("requested")
        self._requested = None if requested is None else (int(requested[0]), float(requested[1]))

    def check(self, ctx: PolicyContext) -> None:
        """One decision: request a larger batch if the GNS grew enough."""
        gns = ctx.metrics.get(self.metric)
        if not isinstance(gns, (int, float)) or not math.isfinite(gns) or gns <= 0:
            return  # no estimate yet
        batch = ctx.batch_size
        if self._requested is not None and batch == self._requested[0]:
            self.reference = self._requested[1]  # our change was applied: measure from there
        elif self.reference is None or batch != self._reference_batch:
            self.reference = gns  # first check, or another policy changed the batch
        self._requested = None
        self._reference_batch = batch
        ratio = gns / self.reference
        if ratio < self.threshold:
            return
        if batch is None:  # (batch * ratio below would fail with a TypeError)
            raise ValueError("GNSBatchSizePolicy: the runner controls no batch size; give it batch_size= (the global batch)")
        unit = ctx.size * self.round_to
        target = min(self.max_batch_size, int(batch * ratio))
        target = target // unit * unit
        if target <= batch:
            return
        self._requested = (target, gns)
        ctx.set_batch_size(target, reason=f"{self.metric} {gns:.4g} grew x{ratio:.3g} since {self.reference:.4g}")
