"""``ResourceProvisioningPolicy``: KungFu's adaptive resource provisioning (§6.2 (3), Fig. 6).

Example:
    >>> from kungfu_tf.policy import ResourceProvisioningPolicy
    >>> p = ResourceProvisioningPolicy(every=400, alpha=0.33)
    >>> p.keeps(size_before=4, throughput_before=100.0, throughput_after=109.0)  # needs > 1 + 0.33/4 = 1.0825x
    True
    >>> p.keeps(size_before=6, throughput_before=100.0, throughput_after=105.0)  # needs > 1.055x
    False
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kungfu_tf.policy.measured_scaling_policy import MeasuredScalingPolicy, log_line

if TYPE_CHECKING:
    from kungfu_tf.policy.context import PolicyContext


class ResourceProvisioningPolicy(MeasuredScalingPolicy):
    """Adds one worker every ``every`` steps while the throughput grows enough; then removes the last and stops.

    KungFu's policy: "adds one worker every K steps. It then evaluates the
    average total accumulated throughput and, if the new throughput is not
    1 + α(1/size) times higher, it removes the worker and stops scaling"
    (α = 0.33, K = 400 in the paper). Here: each size is measured for
    ``every`` steps (K; the ``warmup_steps`` after each size change are
    skipped, and a growth's waiting steps are not counted), its throughput
    being the mean of ``ctx.metrics["throughput"]`` over those steps and all
    workers. After ``n + 1`` workers were measured, the new worker is kept
    when ``R_{n+1} > (1 + alpha / n) * R_n``, with ``n`` the size *before*
    adding it (perfect scaling gives ``R_{n+1} / R_n = 1 + 1/n``, so alpha is
    the fraction of the ideal gain a worker must bring: the same rule as
    Or et al.'s ``s_{n,1} > alpha``); otherwise the cluster goes back to ``n``
    workers and the policy stops. It also stops at ``max_size`` (or the job's
    ``--max-np``), and when a growth does not happen within
    ``grow_timeout_steps``. Logs each decision; puts
    ``provisioning/throughput_at_<n>`` and ``provisioning/gain_<n>_<n+1>`` into
    ``ctx.metrics``.

    Args:
        every: K, steps measured per size (>= 1).
        alpha: the fraction of the ideal gain required, in [0, 1].
        max_size: the largest size the policy asks for (None: the job's --max-np).
        warmup_steps, grow_timeout_steps: as for :class:`~kungfu_tf.policy.AutoscalingPolicy`.
    """

    prefix = "provisioning"

    def __init__(
        self,
        *,
        every: int = 400,
        alpha: float = 0.33,
        max_size: int | None = None,
        warmup_steps: int = 2,
        grow_timeout_steps: int = 1000,
    ):
        super().__init__("every", every, warmup_steps, grow_timeout_steps, 1, max_size)
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or not 0 <= alpha <= 1:
            raise ValueError(f"ResourceProvisioningPolicy: alpha must be in [0, 1], got {alpha!r}")
        self.every = every
        self.alpha = float(alpha)
        self.throughputs: dict[int, float] = {}
        self.reference: int | None = None  # the size measured before the current one

    def config(self) -> dict[str, Any]:
        return {
            "every": self.every,
            "alpha": self.alpha,
            "max_size": self.max_size,
            "warmup_steps": self.measurement.warmup_steps,
            "grow_timeout_steps": self.measurement.grow_timeout_steps,
        }

    def keeps(self, size_before: int, throughput_before: float, throughput_after: float) -> bool:
        """Whether the worker added to ``size_before`` workers stays: ``R_after > (1 + alpha / size_before) * R_before``."""
        return throughput_after > (1.0 + self.alpha / size_before) * throughput_before

    def on_measured(self, ctx: PolicyContext, size: int, throughput: float, elapsed: float) -> None:
        self.throughputs[size] = throughput
        log_line(ctx, f"provisioning: R_{size} = {throughput:.4g} samples/s (mean over {self.every} steps)")
        before = self.reference
        if before is not None and size == before + 1:
            r_before = self.throughputs[before]
            needed = 1.0 + self.alpha / before
            verdict = (f"R_{size}/R_{before} = {throughput / r_before:.4f} "
                       f"{'>' if self.keeps(before, r_before, throughput) else '<='} 1 + {self.alpha:g}/{before} = {needed:.4f}")  # fmt: skip
            if not self.keeps(before, r_before, throughput):
                self.settle(ctx, before, f"{verdict}: remove the added worker and stop scaling")
                return
            log_line(ctx, f"provisioning: keep worker {size}: {verdict}")
        self.reference = size
        _, hi = self.bounds(ctx)
        if hi is not None and size + 1 > hi:
            self.settle(ctx, size, f"at the upper bound {hi}")
            return
        self.move(ctx, size + 1, f"add one worker to {size}")

    def publish(self, ctx: PolicyContext) -> None:
        super().publish(ctx)
        for k, r in sorted(self.throughputs.items()):
            ctx.metrics[f"provisioning/throughput_at_{k}"] = r
            if k - 1 in self.throughputs and self.throughputs[k - 1] > 0:
                ctx.metrics[f"provisioning/gain_{k - 1}_{k}"] = r / self.throughputs[k - 1]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(throughputs={str(k): v for k, v in sorted(self.throughputs.items())}, reference=self.reference)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.throughputs = {int(k): float(v) for k, v in state.get("throughputs", {}).items()}
        self.reference = state.get("reference")
