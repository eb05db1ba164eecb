"""``BasePolicy``: what an adaptation policy overrides (KungFu §3.3).

Example:
    >>> from kungfu_tf.policy import BasePolicy
    >>> class Every100(BasePolicy):
    ...     def after_step(self, ctx):
    ...         if ctx.step % 100 == 0:
    ...             ctx.set_learning_rate(ctx.learning_rate * 0.9)
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kungfu_tf.policy.context import PolicyContext

HOOKS = ("before_train", "after_train", "before_epoch", "after_epoch", "before_step", "after_step")


class BasePolicy:
    """An adaptation policy: override any of the six hooks; each gets a :class:`PolicyContext`.

    Hooks run in Python between training steps, on every worker, in the
    order the policies were given to the runner. They read ``ctx.metrics``
    (monitored values) and request changes with ``ctx.set_batch_size``,
    ``ctx.set_learning_rate`` and ``ctx.set_topology``; the runner applies
    all requests of one hook phase together, after checking that every
    worker asked for the same (KungFu Alg. 1). A policy whose decisions
    depend on values measured per worker (times, say) must agree on them
    first, e.g. with ``ctx.all_reduce``.

    ``needs_monitor``: set True in a subclass that reads gradient statistics;
    the runner then refuses to start without a ``GradientMonitor``.

    Example:
        >>> import kungfu_tf.policy as kfp
        >>> class DoubleAtEpoch2(kfp.BasePolicy):      # as short as KungFu's Listing 1
        ...     def after_epoch(self, ctx):
        ...         if ctx.epoch == 2:
        ...             ctx.set_batch_size(2 * ctx.batch_size, reason="epoch 2")
    """

    needs_monitor: bool = False

    def runs_at(self, hook: str, step: int, epoch: int) -> bool:
        """Whether the runner should call ``hook`` now (default: always).

        ``step`` is the step the hook is about (as ``ctx.step``), ``epoch``
        the epoch (as ``ctx.epoch``). A policy that acts only every N steps
        says so here: on steps where no policy runs, the runner skips the
        phase entirely (no metric reads, no agreement round), which is what
        keeps a per-step policy from costing every step. The answer must
        depend only on values every worker shares (step, epoch, the policy's
        own settings), so that all workers skip alike.
        """
        return True

    def config(self) -> dict[str, Any]:
        """The policy's parameters (JSON-able); the runner checks that every worker has the same.

        Default: the public attributes whose values are JSON-able, without
        the keys of :meth:`state_dict` (runtime state). Override it when a
        public attribute is runtime state, or is meant to differ per worker.

        Example:
            >>> from kungfu_tf.policy import AdaptiveTopologyPolicy
            >>> AdaptiveTopologyPolicy(window=4).config()["window"]
            4
        """
        runtime = set(self.state_dict())
        out = {}
        for name, value in sorted(vars(self).items()):
            if name.startswith("_") or name in runtime:
                continue
            try:
                json.dumps(value, sort_keys=True)
            except (TypeError, ValueError):
                continue
            out[name] = value
        return out

    def state_dict(self) -> dict[str, Any]:
        """The policy's runtime state (JSON-able), saved with the runner's state (default: none).

        Override it, with :meth:`load_state_dict`, in a policy whose
        decisions depend on what it saw before (a reference value, say), so
        that a run resumed from a checkpoint decides as the uninterrupted
        run would. The runner stores it in ``runner.state`` after each phase
        in which the policy ran.
        """
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopts a :meth:`state_dict` restored from a checkpoint (called in ``before_train``)."""

    def before_train(self, ctx: PolicyContext) -> None:
        """Called once, before the first step."""

    def after_train(self, ctx: PolicyContext) -> None:
        """Called once, after the last step."""

    def before_epoch(self, ctx: PolicyContext) -> None:
        """Called at the start of each epoch (``ctx.epoch`` is the new one)."""

    def after_epoch(self, ctx: PolicyContext) -> None:
        """Called at the end of each epoch."""

    def before_step(self, ctx: PolicyContext) -> None:
        """Called before each step (``ctx.step`` is the step about to run, from 0)."""

    def after_step(self, ctx: PolicyContext) -> None:
        """Called after each step, with that step's metrics in ``ctx.metrics``."""


def overrides(policy: BasePolicy, hook: str) -> bool:
    """Whether ``policy``'s class defines its own ``hook`` (the runner skips phases nobody uses)."""
    return getattr(type(policy), hook) is not getattr(BasePolicy, hook)
