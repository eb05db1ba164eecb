"""Applying agreed changes: the batch size (with hysteresis and the learning-rate rule), topology, cluster size.

:class:`Applier` holds the rules that shape a change and what they
remember (the batch the job wants, the step of the last batch change, a
growth still waiting for joiners); the settings themselves are the
runner's (:class:`Adjustable`), and every change is recorded as a
:class:`~kungfu_tf.policy.decision_log.Decision`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import tensorflow as tf

from kungfu_tf.ops import adapt
from kungfu_tf.policy.cluster_following import read_topology
from kungfu_tf.policy.decision_log import PENDING, Decision
from kungfu_tf.policy.errors import PolicyDisagreementError
from kungfu_tf.policy.hysteresis import Hysteresis
from kungfu_tf.policy.learning_rate_rule import scaled_learning_rate
from kungfu_tf.policy.resize_batch import ResizeBatchRule
from kungfu_tf.policy.variable_access import VariableAccess


class Adjustable(Protocol):
    """The settings a change applies to (the :class:`~kungfu_tf.policy.PolicyRunner`)."""

    batch_size: int | None
    learning_rate: float | None
    topology: str
    size: int
    steps_done: int
    detached: bool
    access: VariableAccess

    @property
    def peers(self) -> tuple[str, ...]: ...
    def refresh_cluster(self) -> None: ...


class Applier:
    """Applies a phase's agreed requests, and the batch's following of a new cluster size.

    Args:
        lr_rule: how the learning rate follows the global batch (checked), or None.
        hysteresis: which batch-size changes are refused.
        resize_rule: what a change of the cluster size does to the batch.
        wanted_batch: the batch the job wants (per worker, or global: see
            ``resize_rule``), None without a batch size.
        decide: records a :class:`Decision` in the decision log.
    """

    def __init__(
        self,
        lr_rule: str | None,
        hysteresis: Hysteresis,
        resize_rule: ResizeBatchRule,
        wanted_batch: int | None,
        decide: Callable[[Decision], None],
    ):
        self.lr_rule = lr_rule
        self.hysteresis = hysteresis
        self.resize_rule = resize_rule
        self.wanted_batch = wanted_batch
        self.last_batch_change: int | None = None
        self.asked_size: int | None = None  # a growth asked for and not reached yet
        self._decide = decide

    def apply(
        self, run: Adjustable, requests: dict[str, Any], by: dict[str, str], reasons: dict[str, str], metrics: dict[str, Any]
    ) -> None:
        """Applies ``requests`` in the order of ``policy_round.SETTINGS``; ``metrics`` feed the learning-rate rule."""
        step = run.steps_done
        # (PolicyContext.set_batch_size refuses to ask without a batch size.)
        if "batch_size" in requests and run.batch_size is not None and requests["batch_size"] != run.batch_size:
            old, new = run.batch_size, requests["batch_size"]
            refusal = self.hysteresis.refusal(step, self.last_batch_change, old, new)
            self._decide(Decision(step, "batch_size", old, new, by["batch_size"], reasons.get("batch_size", ""), refusal or ""))
            if refusal is None:
                # (before_train refuses an lr_rule without a learning rate it can read.)
                if self.lr_rule is not None and run.learning_rate is not None and "learning_rate" not in requests:
                    # Computed before the batch variable changes (the
                    # statistics belong to the old batch), applied below.
                    requests["learning_rate"] = scaled_learning_rate(self.lr_rule, run.learning_rate, old, new, metrics)
                    by["learning_rate"] = f"lr_rule={self.lr_rule}"
                run.access.assign_local_batch_size(new // run.size)
                run.batch_size = new
                self.wanted_batch = self.resize_rule.wanted(new, run.size)
                self.last_batch_change = step
        if "learning_rate" in requests and requests["learning_rate"] != run.learning_rate:
            old_lr, new_lr = run.learning_rate, float(requests["learning_rate"])
            run.access.assign_learning_rate(new_lr)
            run.learning_rate = new_lr
            self._decide(Decision(step, "learning_rate", old_lr, new_lr, by["learning_rate"], reasons.get("learning_rate", "")))
        if "topology" in requests and requests["topology"] != run.topology:
            old_t, new_t = run.topology, requests["topology"]
            with tf.init_scope():
                switched = bool(adapt.set_topology(new_t, key="kungfu_policy/set_topology").numpy())
            if not switched:  # cannot happen after our consensus, unless another caller interfered
                raise PolicyDisagreementError(f"workers differ on topology: set_topology({new_t!r}) was refused")
            run.topology = read_topology()
            self._decide(Decision(step, "topology", old_t, new_t, by["topology"], reasons.get("topology", "")))
        if "size" in requests and isinstance(requests["size"], list):
            if tuple(requests["size"]) != run.peers:
                self._resize_to(run, step, requests["size"], by["size"], reasons.get("size", ""))
        elif "size" in requests and (requests["size"] != run.size or self.asked_size not in (None, run.size)):
            # A request for the current size while a growth is pending cancels
            # the growth (kungfu_tf.ops.resize lowers the job's target size).
            self._resize(run, step, requests["size"], by["size"], reasons.get("size", ""))

    def follow_size(self, run: Adjustable, size: int, started: bool, metrics: dict[str, Any]) -> None:
        """The batch (and with ``lr_rule`` the learning rate) after the cluster went from ``run.size`` to ``size``.

        The per-worker batch at the new size is the ``on_resize`` rule's;
        the variables are assigned only once training ``started``.
        """
        if size != run.size and run.batch_size is not None and self.wanted_batch is not None:
            old = run.batch_size
            local = self.resize_rule.local_batch(size, self.wanted_batch)
            run.batch_size = local * size
            if started:
                run.access.assign_local_batch_size(local)
            reason = f"the cluster went from {run.size} to {size} workers (on_resize={self.resize_rule.mode})"
            if run.batch_size != old:
                self._decide(Decision(run.steps_done, "batch_size", old, run.batch_size, "resize", reason))
                if self.lr_rule is not None and started and run.learning_rate is not None:
                    new_lr = scaled_learning_rate(self.lr_rule, run.learning_rate, old, run.batch_size, metrics)
                    run.access.assign_learning_rate(new_lr)
                    self._decide(Decision(run.steps_done, "learning_rate", run.learning_rate, new_lr,
                                          f"lr_rule={self.lr_rule}", reason))  # fmt: skip
                    run.learning_rate = new_lr

    def reached(self, size: int) -> None:
        """The cluster has ``size`` workers: a growth asked for up to that is done."""
        if self.asked_size is not None and size >= self.asked_size:
            self.asked_size = None

    def _resize(self, run: Adjustable, step: int, new_size: int, by: str, reason: str) -> None:
        # The elastic runtime: imported only when a policy resizes.
        from kungfu_tf.ops.resize import resize

        old = run.size
        with tf.init_scope():
            changed, detached = (bool(t.numpy()) if hasattr(t, "numpy") else bool(t) for t in resize(new_size))
        # A growth waits for the launcher's joiners: the cluster changes at a later
        # step boundary (the elastic check), where refresh_cluster() picks it up.
        if new_size == old:
            pending = ""
            reason = f"{reason}; " if reason else ""
            reason += f"cancels the pending growth to {self.asked_size}"
        else:
            pending = "" if changed or detached else f"{PENDING}: joiners are warming up"
        self.asked_size = new_size if pending else None
        self._decide(Decision(step, "size", old, new_size, by, reason, pending))
        if detached:
            run.detached = True
            return
        if changed:
            run.refresh_cluster()

    def _resize_to(self, run: Adjustable, step: int, workers: list[str], by: str, reason: str) -> None:
        """``resize(workers=...)``: keeps exactly these members (evicts the others), at once."""
        from kungfu_tf.ops.resize import resize

        old = list(run.peers)
        with tf.init_scope():
            changed, detached = (bool(t.numpy()) if hasattr(t, "numpy") else bool(t) for t in resize(workers=workers))
        # Not applied: another membership change won the race for the version (applied at the next check).
        refused = "" if changed or detached else "lost a race with another membership change; ask again"
        self._decide(Decision(step, "workers", old, list(workers), by, reason, refused))
        if detached:
            run.detached = True
            return
        if changed:
            run.refresh_cluster()
