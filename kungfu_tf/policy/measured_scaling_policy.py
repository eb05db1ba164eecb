"""``MeasuredScalingPolicy``: the part the autoscaling policies share: measure each cluster size, agree, resize.

Subclasses decide (``on_measured``); this class runs after every step while
the policy has not settled, keeps the :class:`SizeMeasurement` window,
agrees on the measured throughput with one ``ctx.all_reduce`` per decision
(not per step), turns decisions into ``ctx.resize`` requests and logs each
of them. While it searches, the runner runs its agreement round (one small
collective) after every step; once settled the policy stops running
(``runs_at`` is False), so a settled job pays nothing per step.

Example:
    >>> from kungfu_tf.policy import ResourceProvisioningPolicy
    >>> ResourceProvisioningPolicy(every=50).runs_at("after_step", 0, 0)
    True
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.size_measurement import (
    NO_METRIC,
    READY,
    RESIZED,
    TIMEOUT,
    SizeMeasurement,
)

if TYPE_CHECKING:
    from kungfu_tf.policy.context import PolicyContext


def log_line(ctx: PolicyContext, text: str) -> None:
    """A decision-log line (``ctx.log``; before the context had it: printed by rank 0)."""
    log = getattr(ctx, "log", None)
    if callable(log):
        log(text)
    elif ctx.rank == 0:
        print(f"[kungfu_tf.policy] {text}", flush=True)


_UNKNOWN = object()


def size_bounds(ctx: PolicyContext, min_size: int, max_size: int | None) -> tuple[int, int | None]:
    """The policy's ``[min_size, max_size]`` within the job's ``(--min-np, --max-np)`` (``ctx.size_bounds``).

    ``ctx.size_bounds`` None means the job is not elastic: the only size is the current one.

    Example:
        >>> class Ctx:
        ...     size, size_bounds = 2, (1, 4)
        >>> size_bounds(Ctx(), 2, 8)
        (2, 4)
    """
    job = getattr(ctx, "size_bounds", _UNKNOWN)
    if job is None:
        return ctx.size, ctx.size
    lo, hi = min_size, max_size
    if job is not _UNKNOWN:
        job_lo, job_hi = cast("tuple[int, int]", job)  # ctx.size_bounds (a stand-in ctx may lack it)
        if job_lo:
            lo = max(lo, int(job_lo))
        if job_hi:
            hi = int(job_hi) if hi is None else min(hi, int(job_hi))
    return lo, hi


class MeasuredScalingPolicy(BasePolicy):
    """Measures the aggregate throughput (``ctx.metrics["throughput"]``) at each size; subclasses decide.

    Needs the runner's ``throughput`` metric (global batch / step time): give
    the :class:`~kungfu_tf.policy.PolicyRunner` ``batch_size=``. Runs in an
    elastic job (``kungfu-run --elastic``); the sizes it asks for are bounded
    by ``min_size``/``max_size`` and the job's ``--min-np``/``--max-np``.
    """

    prefix = "scaling"  # the metrics' and log lines' prefix

    def __init__(self, every_name: str, every: int, warmup_steps: int, grow_timeout_steps: int, min_size: int,
                 max_size: int | None):  # fmt: skip
        owner = type(self).__name__
        self.measurement = SizeMeasurement(every, warmup_steps, grow_timeout_steps, owner=owner, steps_name=every_name)
        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size <= 0:
            raise ValueError(f"{owner}: min_size must be a positive int, got {min_size!r}")
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0):
            raise ValueError(f"{owner}: max_size must be a positive int or None, got {max_size!r}")
        if max_size is not None and min_size > max_size:
            raise ValueError(f"{owner}: min_size={min_size} > max_size={max_size}")
        self.min_size = min_size
        self.max_size = max_size
        self.settled = False
        self.settled_size: int | None = None
        self.started_at: float | None = None  # wall clock (time.time()) of the start, agreed at the first decision
        self.decisions = 0

    # --- hooks ------------------------------------------------------------------
    def runs_at(self, hook: str, step: int, epoch: int) -> bool:
        if hook == "after_step":
            return not self.settled  # shared by all workers (state_dict carries it to joiners)
        return True

    def before_train(self, ctx: PolicyContext) -> None:
        if ctx.batch_size is None:
            raise ValueError(self._no_throughput())
        if self.started_at is None:
            self.started_at = time.time()

    def after_step(self, ctx: PolicyContext) -> None:
        if self.settled:
            return
        event = self.measurement.observe(ctx.step, ctx.size, ctx.metrics.get("throughput"))
        if event == RESIZED:
            old = self.measurement.previous_size
            what = "" if old is None else f" (was {old}{', as asked' if self.measurement.reached_pending else ''})"
            log_line(ctx, f"{self.prefix}: measuring {ctx.size} workers{what} over steps "
                          f"{self.measurement.measure_from}..{self.measurement.measure_from + self.measurement.steps - 1}")
        elif event == NO_METRIC:
            raise ValueError(self._no_throughput())
        elif event == TIMEOUT:
            target = self.measurement.pending
            assert target is not None
            log_line(ctx, f"{self.prefix}: the cluster did not grow to {target} workers within "
                          f"grow_timeout_steps={self.measurement.grow_timeout_steps} steps; staying at {ctx.size}")
            self.on_timeout(ctx, target)
        elif event == READY:
            total, count = self.measurement.take()
            now = time.time()
            started = self.started_at if self.started_at is not None else now
            agreed = ctx.all_reduce([total, count, now, started], op="mean", name=f"kungfu_policy/{self.prefix}/measure")
            if agreed[1] <= 0:
                raise ValueError(f"{type(self).__name__}: no worker measured a throughput at {ctx.size} workers")
            self.started_at = float(agreed[3])
            self.decisions += 1
            self.on_measured(ctx, ctx.size, float(agreed[0] / agreed[1]), float(agreed[2]) - self.started_at)
        self.publish(ctx)

    # --- for subclasses ---------------------------------------------------------
    def on_measured(self, ctx: PolicyContext, size: int, throughput: float, elapsed: float) -> None:
        """A decision: the agreed mean throughput (samples/s) at ``size`` workers, ``elapsed`` s since the start."""
        raise NotImplementedError(f"{type(self).__name__} must implement on_measured")

    def on_timeout(self, ctx: PolicyContext, target: int) -> None:
        """The growth to ``target`` did not happen in time (default: settle where we are, which cancels it)."""
        self.settle(ctx, ctx.size, f"the growth to {target} did not happen")

    def publish(self, ctx: PolicyContext) -> None:
        """Puts the policy's statistics into ``ctx.metrics`` (written to TensorBoard by the runner)."""
        if self.settled_size is not None:
            ctx.metrics[f"{self.prefix}/settled_size"] = self.settled_size

    def bounds(self, ctx: PolicyContext) -> tuple[int, int | None]:
        return size_bounds(ctx, self.min_size, self.max_size)

    def move(self, ctx: PolicyContext, target: int, reason: str) -> None:
        """Asks for ``target`` workers to measure them next (a growth is awaited, its steps not counted)."""
        if target > ctx.size:
            self.measurement.ask_growth(target, ctx.step)
        log_line(ctx, f"{self.prefix}: resize {ctx.size} -> {target}: {reason}")
        ctx.resize(target, reason=f"{self.prefix}: {reason}")

    def settle(self, ctx: PolicyContext, target: int, reason: str) -> None:
        """Stops searching at ``target`` workers (resizing there if needed)."""
        self.settled, self.settled_size = True, target
        log_line(ctx, f"{self.prefix}: settled at {target} workers ({reason})")
        # A resize to the current size also cancels a pending growth (kungfu_tf.ops.resize).
        if target != ctx.size or self.measurement.pending is not None:
            ctx.resize(target, reason=f"{self.prefix}: settle at {target}: {reason}")
        self.measurement.pending = None

    # --- state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "measurement": self.measurement.state_dict(),
            "settled": self.settled,
            "settled_size": self.settled_size,
            "started_at": self.started_at,
            "decisions": self.decisions,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.measurement.load_state_dict(state.get("measurement", {}))
        self.settled = bool(state.get("settled", False))
        self.settled_size = state.get("settled_size")
        self.started_at = state.get("started_at", self.started_at)
        self.decisions = int(state.get("decisions", 0))

    def _no_throughput(self) -> str:
        return (
            f"{type(self).__name__} needs ctx.metrics['throughput'] (global batch / step time), which the runner "
            "computes only when it knows the batch: give the PolicyRunner batch_size=<global batch>"
        )
