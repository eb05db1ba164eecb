"""``GNSResizePolicy``: add workers as the gradient noise scale grows (KungFu Listing 1).

Example:
    >>> from kungfu_tf.policy import GNSResizePolicy
    >>> policy = GNSResizePolicy(max_size=8)              # checked after every epoch
    >>> policy.decide(gns=100.0, size=2), policy.decide(gns=150.0, size=2)
    (None, 3)
"""

from __future__ import annotations

import math
from typing import Any

from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.periodic_policy import PeriodicPolicy

UNITS = ("step", "epoch")


class GNSResizePolicy(PeriodicPolicy):
    """Scales the number of workers with the growth of the gradient noise scale (KungFu §3.2, Listing 1).

    The GNS estimates the largest useful global batch; with a fixed per-worker
    batch, more workers mean a larger global batch, so when the GNS grows the
    cluster can grow with it without hurting statistical efficiency. The rule
    is Listing 1's, every ``every`` epochs (or steps): with ``g`` the
    monitor's smoothed GNS (computed from all-reduced statistics, so the same
    on every worker, which is what Listing 1's ``allreduce(gns) / size``
    achieves) and ``g0`` the reference,

    * at the first check, ``g0 = g``;
    * if ``g > g0``: ``new_size = int(size * g / g0)``, capped at ``max_size``;
      if that is larger than ``size``, ``ctx.resize(new_size)``; then ``g0 = g``;
    * if ``g <= g0``: nothing (the cluster never shrinks, and ``g0`` stays).

    ``size`` is the size last asked for while that growth is pending: here a
    growth is asynchronous (the members train on while the joiners warm up),
    whereas Listing 1's ``resize`` has returned with the new workers by the
    next check. Without this, a check that comes while joiners warm up (an
    epoch of a small model is shorter than a worker's start) measures the
    GNS's growth against the old size, asks for nothing, and moves ``g0``:
    the growth it saw is lost.

    Listing 1's ``before_epoch`` broadcast of the model after a resize is not
    needed here: joiners fetch the whole training state from the survivors
    when they are admitted (``kungfu_tf.elastic``). Needs a ``GradientMonitor``
    and an elastic job (``kungfu-run --elastic --max-np N``; growth waits for
    the launcher's joiners to warm up).

    Args:
        max_size: the largest cluster the policy asks for (None: no cap here;
            the launcher's ``--max-np`` still bounds it).
        every: check every this many epochs (or steps).
        unit: "epoch" (Listing 1) or "step".
        metric: the metric followed (default "gns").

    Example:
        >>> import kungfu_tf.keras as kfk
        >>> from kungfu_tf.policy import GNSResizePolicy
        >>> cb = kfk.PolicyCallback([GNSResizePolicy(max_size=8)])  # doctest: +SKIP
    """

    needs_monitor = True

    def __init__(self, max_size: int | None = None, every: int = 1, unit: str = "epoch", metric: str = "gns"):
        if max_size is not None and (isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0):
            raise ValueError(f"GNSResizePolicy: max_size must be a positive int or None, got {max_size!r}")
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            raise ValueError(f"GNSResizePolicy: every must be a positive int, got {every!r}")
        if unit not in UNITS:
            raise ValueError(f"GNSResizePolicy: unit must be one of {', '.join(UNITS)}, got {unit!r}")
        self.max_size = max_size
        self.every = every
        self.unit = unit
        self.metric = metric
        self.reference: float | None = None  # Listing 1's prev_gns
        self.asked: int | None = None  # the size of a growth asked for and not reached yet

    def config(self) -> dict[str, Any]:
        return {"max_size": self.max_size, "every": self.every, "unit": self.unit, "metric": self.metric}

    def state_dict(self) -> dict[str, Any]:
        # Joiners and resumed runs measure growth from the same reference.
        return {"reference": self.reference, "asked": self.asked}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reference = state.get("reference")
        self.asked = state.get("asked")

    def decide(self, gns: float, size: int) -> int | None:
        """Listing 1's rule: the new cluster size for ``gns`` at ``size`` workers, or None; updates the reference.

        Example:
            >>> p = GNSResizePolicy(max_size=5)
            >>> [p.decide(g, 2) for g in (10.0, 9.0, 12.0, 30.0)]  # 12/10 -> int(2.4) = 2: no change
            [None, None, None, 5]
        """
        if not isinstance(gns, (int, float)) or not math.isfinite(gns) or gns <= 0:
            return None  # no estimate yet
        if self.reference is None:
            self.reference = float(gns)
            return None
        if gns <= self.reference:
            return None
        target = int(size * gns / self.reference)
        if self.max_size is not None:
            target = min(target, self.max_size)
        self.reference = float(gns)
        return target if target > size else None  # a cap below the current size never shrinks it

    def check(self, ctx: PolicyContext) -> None:
        """One decision: ask for more workers if the GNS grew (from the size of a pending growth, if any).

        Example:
            >>> class Ctx: size, metrics = 1, {}
            >>> ctx, p = Ctx(), GNSResizePolicy()
            >>> ctx.resize = lambda n, reason: print(f"resize({n}): {reason}")
            >>> for g in (10.0, 25.0, 40.0):   # the growth to 2 is still pending at the third check
            ...     ctx.metrics["gns"] = g; p.check(ctx)
            resize(2): gns 25 grew x2.5 since 10
            resize(3): gns 40 grew x1.6 since 25 (from the 2 workers asked for)
        """
        if self.asked is not None and ctx.size >= self.asked:
            self.asked = None  # reached (or passed, by another policy's resize)
        size = ctx.size if self.asked is None else self.asked
        old = self.reference
        gns = ctx.metrics.get(self.metric)
        target = self.decide(gns, size)  # type: ignore[arg-type]
        if target is not None and old is not None and gns is not None:  # decide() returned a target: all are numbers
            pending = "" if size == ctx.size else f" (from the {size} workers asked for)"
            ctx.resize(target, reason=f"{self.metric} {gns:.4g} grew x{gns / old:.3g} since {old:.4g}{pending}")
            self.asked = target
