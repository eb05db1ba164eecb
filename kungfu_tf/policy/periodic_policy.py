"""A policy that decides every N steps or epochs: the schedule shared by the built-in GNS policies.

Example:
    >>> class Every10Steps(PeriodicPolicy):
    ...     def __init__(self):
    ...         self.every, self.unit, self.checks = 10, "step", 0
    ...     def check(self, ctx):
    ...         self.checks += 1
    >>> p = Every10Steps()
    >>> [p.runs_at("after_step", s, 0) for s in (8, 9)]
    [False, True]
"""

from __future__ import annotations

from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.context import PolicyContext


class PeriodicPolicy(BasePolicy):
    """Calls ``check(ctx)`` after every ``every``-th step or epoch (``unit``).

    Subclasses set ``self.every`` (int >= 1) and ``self.unit`` ("step" or
    "epoch") and implement ``check``; ``runs_at`` tells the runner to skip
    every other hook, so off-schedule steps cost no agreement round.
    """

    every: int
    unit: str

    def runs_at(self, hook: str, step: int, epoch: int) -> bool:
        if hook == "after_step":
            return self.unit == "step" and (step + 1) % self.every == 0
        if hook == "after_epoch":
            return self.unit == "epoch" and (epoch + 1) % self.every == 0
        return True

    def after_step(self, ctx: PolicyContext) -> None:
        if self.runs_at("after_step", ctx.step, ctx.epoch):
            self.check(ctx)

    def after_epoch(self, ctx: PolicyContext) -> None:
        if self.runs_at("after_epoch", ctx.step, ctx.epoch):
            self.check(ctx)

    def check(self, ctx: PolicyContext) -> None:
        """One decision at a scheduled step or epoch."""
        raise NotImplementedError(f"{type(self).__name__} must implement check(ctx)")
