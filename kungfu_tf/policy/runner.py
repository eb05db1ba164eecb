"""``PolicyRunner``: runs adaptation policies between training steps and applies their requests consistently.

The Keras ``PolicyCallback`` and the v1 ``PolicyHook`` drive one; a custom
``tf.function`` loop drives it directly:

Example:
    >>> import tensorflow as tf
    >>> import kungfu_tf
    >>> from kungfu_tf.data import adaptive_batch, shard
    >>> from kungfu_tf.policy import GNSBatchSizePolicy, PolicyRunner
    >>> runner = PolicyRunner([GNSBatchSizePolicy(max_batch_size=1024)], batch_size=64,
    ...                       optimizer=opt, lr_rule="sqrt", log_dir="logs")  # doctest: +SKIP
    >>> ds = adaptive_batch(shard(dataset), runner.local_batch_size)      # doctest: +SKIP
    >>> train_step = tf.function(step_fn, input_signature=ds.element_spec)  # doctest: +SKIP
    >>> with runner.training():                                          # doctest: +SKIP
    ...     for epoch in range(10):
    ...         with runner.epoch_scope():
    ...             for x, y in ds:
    ...                 with runner.step():
    ...                     train_step(x, y)

A plain ``tf.function`` traces again for every new input shape; give it
``input_signature=ds.element_spec`` (as above) or pass it the iterator and
call ``next`` inside (as Keras does). Requests made in ``after_step`` shape
the next batch; in a ``for x in ds`` loop a request made in ``before_step``
comes after that step's batch was fetched, so it shapes the one after.

The runner keeps the lifecycle (the six phases, which policies are due, a
phase's failure) and composes one part per concern: the round after a phase
(:mod:`~kungfu_tf.policy.policy_round` over
:mod:`~kungfu_tf.policy.agreement`), applying the agreed changes
(:mod:`~kungfu_tf.policy.apply`), following the cluster
(:mod:`~kungfu_tf.policy.cluster_following`), the metrics
(:mod:`~kungfu_tf.policy.metrics`), the decision log and TensorBoard
(:mod:`~kungfu_tf.policy.decision_log`) and the policies' saved state
(:mod:`~kungfu_tf.policy.runner_state`). None of them imports the runner.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from kungfu_tf.ops import config
from kungfu_tf.policy import metrics
from kungfu_tf.policy.agreement import Agreement
from kungfu_tf.policy.apply import Applier
from kungfu_tf.policy.base_policy import HOOKS, BasePolicy, overrides
from kungfu_tf.policy.cluster_following import (
    ClusterFollower,
    read_rank_and_size,
    read_topology,
)
from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.decision_log import Decision, DecisionLog
from kungfu_tf.policy.hysteresis import Hysteresis
from kungfu_tf.policy.learning_rate_rule import check_rule
from kungfu_tf.policy.policy_round import Failure, agree_on_setup, settle
from kungfu_tf.policy.resize_batch import ResizeBatchRule
from kungfu_tf.policy.runner_state import PolicyStates
from kungfu_tf.policy.variable_access import EagerVariableAccess, VariableAccess


class PolicyRunner:
    """Calls the policies' hooks in the given order and applies their requests between steps.

    Drive it with ``before_train()``, ``before_epoch()``, ``before_step()``,
    ``after_step()``, ``after_epoch()``, ``after_train()`` or the context
    managers ``training()``, ``epoch_scope()``, ``step()``; every worker must
    drive it alike (same policies, same calls).

    After each hook phase that some policy overrides, the workers run one
    round (:mod:`kungfu_tf.policy.agreement`): all requests of that phase are
    checked with consensus and applied together (batch size, then learning
    rate, then topology), followed by a barrier, so every worker runs the
    next step with the same settings. Workers asking for different values
    all raise :class:`PolicyDisagreementError`; a hook that raises on one
    worker raises there and :class:`PeerPolicyError` on the others.

    Args:
        policies: :class:`BasePolicy` instances, run in this order.
        batch_size: the initial *global* batch size; needed to adapt it. The
            per-worker size ``batch_size // size`` is in the int64 variable
            ``local_batch_size``: build the input with
            ``kungfu_tf.data.adaptive_batch(ds, runner.local_batch_size)``.
        optimizer: a Keras 3 optimizer whose learning rate is adapted (and
            whose ``kungfu_monitor`` is used); or give ``learning_rate``, a
            ``tf.Variable`` the step reads.
        monitor: a ``GradientMonitor``; default ``optimizer.kungfu_monitor``.
        lr_rule: "linear", "sqrt", "adascale" or None: how the learning rate
            follows a batch-size change (see
            :func:`~kungfu_tf.policy.learning_rate_rule.scaled_learning_rate`).
        on_resize, max_global_batch_size: what a change of the cluster size
            does to the batch (:mod:`~kungfu_tf.policy.resize_batch`):
            "keep_local" (default) keeps the per-worker batch (the global
            batch follows the size, up to ``max_global_batch_size``, then
            the per-worker batch shrinks); "keep_global" keeps the global
            batch (``global // size`` per worker). ``lr_rule`` follows every
            change of the global batch, a resize's too.
        min_dwell_steps, min_relative_change: batch-size hysteresis
            (:class:`~kungfu_tf.policy.hysteresis.Hysteresis`).
        log_dir: rank 0 writes TensorBoard scalars of every metric there,
            every ``log_every`` steps, and the decisions as text (other
            ranks may pass None). A log_dir rank 0 cannot write, or a
            failed write, raises on rank 0 (``OSError`` naming log_dir and
            the cause) and :class:`PeerPolicyError` on the others; to learn
            of it, every worker runs one small round per logged step.
        verbose: rank 0 prints every decision.

    State: ``runner.state`` (a checkpointable
    :class:`~kungfu_tf.policy.policy_state.PolicyState`) holds the global
    batch size, the step of the last batch change, the step/sample/epoch
    counters and each policy's ``state_dict()``, serialized only when a
    checkpoint is written (no per-step cost). Add it to your checkpoint,
    e.g. ``tf.train.Checkpoint(model=model, optimizer=opt, policy=runner.state)``:
    a runner whose restored state has taken steps adopts it in
    ``before_train`` (batch size, counters, policy references) instead of
    the constructor's ``batch_size``; the learning rate comes back with the
    optimizer.

    Metrics (``ctx.metrics`` after a step): the monitor's values (``gns``,
    ``noise_trace``, ``grad_sq_norm``, ``grad_variance``, ``compute_time``,
    ``worker_compute_times``, ...) and ``step_time`` (seconds between
    ``before_step`` and ``after_step``, this worker), ``throughput`` (global
    batch / step_time), ``worker_throughput`` (per worker: local batch /
    its compute time, with a monitor), ``batch_size``, ``learning_rate``,
    ``cluster_size``, ``topology``, ``link_rates`` (bytes/s to each peer).
    Policies add their own under "<policy>/<name>"; numbers (and lists, per
    index) among them are written as TensorBoard scalars after the phase.

    The decision log: ``history`` (the applied and refused
    :class:`Decision` records) and ``log_lines`` (their text and the policies'
    ``ctx.log`` lines, in order).

    Raises:
        ValueError: at construction or ``before_train``: a bad argument, an
            ``lr_rule`` without a learning rate, a policy that needs a
            monitor without one.
    """

    def __init__(
        self,
        policies: Sequence[BasePolicy],
        *,
        batch_size: int | None = None,
        optimizer: Any = None,
        learning_rate: Any = None,
        monitor: Any = None,
        lr_rule: str | None = None,
        on_resize: str = "keep_local",
        max_global_batch_size: int | None = None,
        min_dwell_steps: int = 0,
        min_relative_change: float = 0.0,
        log_dir: str | None = None,
        log_every: int = 1,
        verbose: bool = True,
        access: VariableAccess | None = None,
    ):
        self.policies = list(policies)
        for i, p in enumerate(self.policies):
            if not isinstance(p, BasePolicy):
                raise TypeError(f"policies[{i}] must be a kungfu_tf.policy.BasePolicy, got {p!r}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0):
            raise ValueError(f"batch_size must be a positive int (the global batch) or None, got {batch_size!r}")
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every <= 0:
            raise ValueError(f"log_every must be a positive int, got {log_every!r}")
        checked_rule = check_rule(lr_rule)
        hysteresis = Hysteresis(min_dwell_steps, min_relative_change)
        self.rank = config.current_int(config.rank)
        self.size = config.current_int(config.cluster_size)
        if batch_size is not None and batch_size % self.size:
            raise ValueError(f"batch_size {batch_size} (global) is not a multiple of the cluster size {self.size}")
        resize_rule = ResizeBatchRule(on_resize, max_global_batch_size)
        # The batch the job wants (per worker, or global: see ResizeBatchRule); set by batch_size= and set_batch_size.
        wanted = None
        if batch_size is not None:
            wanted = resize_rule.wanted(batch_size, self.size)
            batch_size = resize_rule.local_batch(self.size, wanted) * self.size
        self.batch_size = batch_size
        local = 0 if batch_size is None else batch_size // self.size
        self.access = access if access is not None else EagerVariableAccess(local, optimizer, learning_rate, monitor)
        self.log_dir = log_dir
        self.log_every = log_every
        self.verbose = verbose
        # The parts, one concern each: the decision log, the changes, the cluster, the policies' state.
        self._log = DecisionLog(log_dir)
        self._applier = Applier(checked_rule, hysteresis, resize_rule, wanted, self._decide)
        self._cluster = ClusterFollower()
        self._policy_states = PolicyStates(self.policies)
        self.detached = False  # a resize took this worker out of the cluster: stop training
        self.context = PolicyContext(self)
        self.epoch = 0
        self.steps_done = 0
        self.hook_step = 0
        self.samples = 0
        self.topology = ""
        self.learning_rate: float | None = None
        self._agreement = Agreement()
        self._used = {hook: [p for p in self.policies if overrides(p, hook)] for hook in HOOKS}
        self._step_started: float | None = None
        self._started = False
        self._metrics_read = True  # before the first step: the parameters are all there is
        self._last_elapsed: float | None = None
        self._changed_in_step = False  # a membership change was applied between before_step and after_step
        self._joined = False  # load_state_dict() gave it the members' state (see join_running)

    @property
    def local_batch_size(self) -> Any:
        """The int64 variable holding the per-worker batch size (feed it to ``adaptive_batch``)."""
        return self.access.local_batch_size

    @property
    def monitor(self) -> Any:
        return self.access.monitor

    @property
    def state(self) -> Any:
        """The runner's checkpointable state (:class:`~kungfu_tf.policy.policy_state.PolicyState`): add it to your checkpoint."""
        return self.access.state

    @property
    def history(self) -> list[Decision]:
        """The applied and refused changes, in order."""
        return self._log.history

    @property
    def log_lines(self) -> list[str]:
        """The decision log as text, in order: every :class:`Decision` and every ``ctx.log`` line."""
        return self._log.log_lines

    @property
    def lr_rule(self) -> str | None:
        return self._applier.lr_rule

    @property
    def hysteresis(self) -> Hysteresis:
        return self._applier.hysteresis

    @property
    def resize_rule(self) -> ResizeBatchRule:
        return self._applier.resize_rule

    # --- phases --------------------------------------------------------------
    def before_train(self) -> None:
        """Checks the setup on every worker, then runs ``before_train``."""
        self._check_requirements()
        self.topology = read_topology()
        if self.access.has_learning_rate() and self.access.learning_rate_error() is None:
            self.learning_rate = self.access.read_learning_rate()
        failure = None
        try:  # a restored state or a monitor one worker alone rejects: every worker must learn of it
            if self._started:
                # Started again in this process (elastic.run calls the training
                # function again after a membership change): the counters in
                # memory are current; the saved state may predate the change.
                self.refresh_cluster()
            elif not self._adopt_state():
                self._check_monitor_batch()
        except ValueError as e:
            failure = ("PolicyRunner.before_train", e)
        self._open_summary(failure)
        self._agree_on_setup()
        if self.batch_size is not None:
            self.access.assign_local_batch_size(self.batch_size // self.size)
        self._started = True
        self._cluster.follow(self._on_membership_change)
        self.context.metrics.update(self._parameters())
        self._run("before_train")
        self._save_state()

    def join_running(self) -> None:
        """``before_train`` of a worker that joined an elastic job whose members keep training (v1
        ``PolicyHook``: the members keep their session and never start again; in ``fit`` and
        ``elastic.run`` every member starts again with the joiner and all call :meth:`before_train`).

        No round: the members are running their next step. The members agreed on the setup and ran
        the policies' ``before_train`` when the job started; the counters, the batch, whether rank 0
        logs and each policy's state came with the elastic sync (:meth:`load_state_dict`; give the
        runner to ``ElasticState(..., policy=runner)``), the learning rate with the variables.

        Raises:
            RuntimeError: the runner has not received the members' state, or was started already.
        """
        if self._started:
            raise RuntimeError("PolicyRunner.join_running(): the runner was started already (before_train)")
        if not self._joined:
            raise RuntimeError(
                "PolicyRunner.join_running(): the members' state has not reached this runner: give it to the "
                "elastic state (ElasticState(..., policy=runner)), which loads it when this worker joins"
            )
        self._check_requirements()
        self.topology = read_topology()
        if self.access.has_learning_rate() and self.access.learning_rate_error() is None:
            self.learning_rate = self.access.read_learning_rate()
        if self.batch_size is not None:
            self.access.assign_local_batch_size(self.batch_size // self.size)
        self._started = True
        self._cluster.follow(self._on_membership_change)
        self.context.metrics.update(self._parameters())
        self._save_state()

    def after_train(self) -> None:
        self._log.flush()
        self._run("after_train", force_round=self._log.logging)
        self._save_state()

    def before_epoch(self) -> None:
        self._run("before_epoch")

    def after_epoch(self) -> None:
        self._run("after_epoch")
        self.epoch += 1
        self._save_state()

    def before_step(self) -> None:
        self.hook_step = self.steps_done
        self._run("before_step")
        self._step_started = time.perf_counter()

    def after_step(self) -> None:
        elapsed = None if self._step_started is None else time.perf_counter() - self._step_started
        self._step_started = None
        changed, self._changed_in_step = self._changed_in_step, False
        self.hook_step = self.steps_done
        self.steps_done += 1
        if self.batch_size is not None:
            self.samples += self.batch_size
        if changed:
            # The cluster changed after this step ran (a callback before this
            # one resized, a joiner was admitted): the policies measured the
            # old cluster, and a round now would be with peers that are not
            # in this phase (a joiner is entering fit). The step counts; the
            # policies run again from the next step, with every member.
            self._save_state()
            return
        # Reading the monitor and the link rates costs eager ops: only a phase
        # where a policy runs, or the log writes, reads them (see _run).
        self.context.metrics = metrics.light_metrics(self._parameters(), self.batch_size, elapsed)
        self._metrics_read = False
        self._last_elapsed = elapsed
        log_now = self._log.logging and self.hook_step % self.log_every == 0
        if log_now and self._log.writes:
            self._log.scalars(self.hook_step, self._read_metrics)
        self._run("after_step", force_round=log_now)
        self._save_state()

    @contextlib.contextmanager
    def training(self) -> Iterator[PolicyRunner]:
        """``before_train()``, the body, ``after_train()`` (skipped when the body raises)."""
        self.before_train()
        yield self
        self.after_train()

    @contextlib.contextmanager
    def epoch_scope(self) -> Iterator[PolicyRunner]:
        """``before_epoch()``, the body (one epoch), ``after_epoch()``."""
        self.before_epoch()
        yield self
        self.after_epoch()

    @contextlib.contextmanager
    def step(self) -> Iterator[PolicyRunner]:
        """``before_step()``, the body (one training step), ``after_step()``."""
        self.before_step()
        yield self
        self.after_step()

    # --- the cluster ---------------------------------------------------------
    @property
    def peers(self) -> tuple[str, ...]:
        """The members "host:port" in rank order, as of the last :meth:`refresh_cluster`."""
        return self._cluster.peers

    @peers.setter
    def peers(self, value: Sequence[str]) -> None:
        self._cluster.peers = value

    @property
    def self_peer(self) -> str:
        """This worker's "host:port"."""
        return self._cluster.self_peer

    @property
    def size_bounds(self) -> tuple[int, int] | None:
        """The elastic job's ``(--min-np, --max-np)`` (max 0: unbounded), None outside an elastic job."""
        return self._cluster.size_bounds()

    def refresh_cluster(self) -> None:
        """Reads rank and size again (after an elastic resize); the batch follows the cluster.

        The per-worker batch at the new size is the ``on_resize`` rule's
        (:class:`~kungfu_tf.policy.resize_batch.ResizeBatchRule`); when the
        global batch changes, ``lr_rule`` scales the learning rate, as for a
        policy's ``set_batch_size``. Called by the runner before each phase in
        which a policy runs, and after every membership change this worker
        applies, before the elastic state syncs (so joiners receive the new
        batch and learning rate).
        """
        rank, size = read_rank_and_size()
        self._applier.follow_size(self, size, self._started, self.context.metrics)
        self.rank, self.size = rank, size
        self._cluster.forget()
        self._applier.reached(size)

    def _on_membership_change(self, change: Any) -> None:
        self.refresh_cluster()
        if self._step_started is not None:
            self._changed_in_step = True  # see after_step

    # --- the decision log ----------------------------------------------------
    def log_line(self, text: str, by: str = "") -> None:
        """Adds ``step N: text [by]`` to the decision log (see :meth:`PolicyContext.log`)."""
        line = f"step {self.steps_done}: {text}" + (f" [{by}]" if by else "")
        self._log.add(self.steps_done, line, echo=self._echo())

    def _decide(self, decision: Decision) -> None:
        self._log.decide(decision, echo=self._echo())

    def _echo(self) -> bool:
        return self.verbose and self.rank == 0

    def _open_summary(self, failure: Failure | None) -> None:
        """Rank 0 creates the event file; every worker learns whether rank 0 logs and whether it (and
        the checks before, ``failure``) succeeded."""
        failure = self._log.open(self.rank, failure)
        # Whether rank 0 logs decides the logging rounds: agreed, since the
        # other ranks may pass log_dir=None.
        self._log.logging = self._agreement.status(int(self._log.writes or failure is not None)) > 0
        self._settle(failure)

    # --- checkpoint and elastic state ------------------------------------------
    def state_counters(self, after_this_step: bool = False) -> dict[str, int]:
        """The counters :attr:`state` holds; ``after_this_step``: as they will be once the running step ends."""
        step = int(after_this_step)
        last_change = self._applier.last_batch_change
        return {
            "steps_done": self.steps_done + step,
            "samples": self.samples + step * (self.batch_size or 0),
            "epoch": self.epoch,
            "batch_size": self.batch_size or 0,
            "last_batch_change": -1 if last_change is None else last_change,
        }

    def state_dict(self) -> dict[str, Any]:
        """The counters and every policy's ``state_dict()``, JSON-able: what an elastic joiner needs.

        Give the runner to ``kungfu_tf.elastic.ElasticState(..., policy=runner)``:
        a worker that joins (or a survivor behind the others) then continues
        with the members' counters, batch size and policy references.

        The batch size travels per worker (``local_batch_size``), with the
        batch the job wants (``wanted_batch``, see ``on_resize``): the
        members refresh for the new cluster before the state syncs, and the
        joiner, already in the new one, multiplies the per-worker batch by
        the new size; so both hold the same state_dict (the sync compares
        them), and the joiner adopts the learning rate the sync gave it
        instead of scaling its own.

        Example:
            >>> from kungfu_tf.policy import PolicyRunner
            >>> PolicyRunner([], batch_size=8).state_dict()["local_batch_size"]
            8
        """
        # Taken by the elastic sync between a step's before_step and after_step
        # (a Keras callback resized after the step): as the step will count.
        counters = self.state_counters(after_this_step=self._step_started is not None)
        del counters["batch_size"]  # depends on the cluster size: see local_batch_size
        local = 0 if self.batch_size is None else self.batch_size // self.size
        # Whether rank 0 logs: a joiner that never ran before_train's rounds must hold the logging rounds too.
        return {"counters": counters, "local_batch_size": local, "wanted_batch": self._applier.wanted_batch,
                "logging": self._log.logging, "policies": self._policy_states.state_dicts()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopts another worker's :meth:`state_dict` (of a runner with the same policies), for this cluster.

        Raises:
            ValueError: the state has another number of policies.
        """
        self._policy_states.load(state.get("policies", []))
        self._set_counters(state["counters"])
        self._log.logging = bool(state.get("logging", self._log.logging))
        self._joined = True
        # The members' batch and learning rate are theirs after the change: adopt, do not scale again.
        self.rank, self.size = read_rank_and_size()
        self._cluster.forget()
        if state.get("wanted_batch") is not None:
            self._applier.wanted_batch = int(state["wanted_batch"])
        local = int(state.get("local_batch_size", 0))
        if self.batch_size is not None and local > 0:
            self.batch_size = local * self.size
            if self._started:
                self.access.assign_local_batch_size(self.batch_size // self.size)
        if self.learning_rate is not None and self.access.has_learning_rate() and self.access.learning_rate_error() is None:
            self.learning_rate = self.access.read_learning_rate()  # the elastic sync assigned the members' before this
        self._save_state()

    def _adopt_state(self) -> bool:
        """Continues from a restored (or earlier) state instead of the constructor's values; True if it did."""
        counters, policies = self.access.state.read()
        if counters["steps_done"] <= 0:
            return False
        self._policy_states.check_classes(policies)
        if self.batch_size is not None and counters["batch_size"] > 0:
            if counters["batch_size"] % self.size:
                raise ValueError(
                    f"the restored global batch_size {counters['batch_size']} is not a multiple of the cluster size {self.size}"
                )
            self.batch_size = counters["batch_size"]
            self._applier.wanted_batch = self.resize_rule.wanted(self.batch_size, self.size)
        self._set_counters(counters)
        self._policy_states.adopt(policies)
        return True

    def _set_counters(self, counters: dict[str, int]) -> None:
        self.steps_done, self.samples, self.epoch = counters["steps_done"], counters["samples"], counters["epoch"]
        self.hook_step = self.steps_done
        change = counters["last_batch_change"]
        self._applier.last_batch_change = None if change < 0 else change

    def _save_state(self) -> None:
        self._policy_states.save(self.access.state, self.state_counters())

    # --- setup -----------------------------------------------------------------
    def _check_requirements(self) -> None:
        needy = [type(p).__name__ for p in self.policies if p.needs_monitor]
        if needy and self.access.monitor is None:
            raise ValueError(
                f"{', '.join(needy)} needs gradient statistics, but the runner has no GradientMonitor: wrap the "
                "optimizer as SynchronousSGDOptimizer(opt, monitor=GradientMonitor(batch_size=...)) or pass monitor="
            )
        if self.lr_rule is not None and not self.access.has_learning_rate():
            raise ValueError(
                f"lr_rule={self.lr_rule!r} needs a learning rate to set: give the runner the optimizer "
                "(optimizer=; a compiled Keras model has one) or learning_rate=<tf.Variable>"
            )
        if self.lr_rule is not None and (problem := self.access.learning_rate_error()) is not None:
            raise ValueError(f"lr_rule={self.lr_rule!r} sets the learning rate, but {problem}")
        if self.lr_rule is not None and self.batch_size is None:
            raise ValueError(f"lr_rule={self.lr_rule!r} follows the batch size, but the runner got no batch_size=")
        if self.lr_rule == "adascale" and self.access.monitor is None:
            raise ValueError("lr_rule='adascale' needs a GradientMonitor (its noise_trace and grad_sq_norm)")

    def _check_monitor_batch(self) -> None:
        # The runner assigns the monitor's local_batch_size; a different value
        # the user gave the monitor would be overridden silently.
        monitored = self.access.read_monitor_local_batch_size()
        if self.batch_size is None or not monitored or monitored == self.batch_size // self.size:
            return
        raise ValueError(
            f"the GradientMonitor's local_batch_size is {monitored}, but the runner's batch_size={self.batch_size} "
            f"gives {self.batch_size // self.size} per worker: batch_size is the *global* batch (per-worker batch "
            f"x cluster size {self.size}), e.g. batch_size={monitored * self.size}"
        )

    def _agree_on_setup(self) -> None:
        setup = {
            "policies": [type(p).__qualname__ for p in self.policies],
            "batch_size": self.batch_size,
            "log_every": self.log_every,
            "steps_done": self.steps_done,
            "lr_rule": self.lr_rule,
            "on_resize": self.resize_rule.config(),
            "hysteresis": [self.hysteresis.min_dwell_steps, self.hysteresis.min_relative_change],
        }
        agree_on_setup(self._agreement, setup, self.policies, self.context.requests)

    # --- a phase and its round -------------------------------------------------
    def _run(self, hook: str, force_round: bool = False) -> None:
        if not self._started:
            raise RuntimeError(f"PolicyRunner.{hook}() before before_train()")
        if self.detached:
            return  # a resize took this worker out of the job: no more hooks, no rounds with the old peers
        used = self._due(hook)
        if self._log.failed and force_round:
            write_failure = self._log.take_failure()
            self.context.requests.clear()
            self._settle(write_failure)  # raises on every worker
        if not used:
            if force_round:
                self.context.requests.clear()
                self._settle(None)
            return
        self._policy_states.ran = True
        self.refresh_cluster()
        if not self._metrics_read:
            self._read_metrics()
        ctx = self.context
        ctx.requests.clear()
        ctx.reasons.clear()
        ctx.requested_by.clear()
        failure: Failure | None = None
        for policy in used:
            ctx._hook, ctx._policy = hook, type(policy).__name__
            try:
                getattr(policy, hook)(ctx)
            except Exception as e:  # noqa: BLE001 -- any failure: every worker must learn of it, see _settle
                failure = (f"{type(policy).__name__}.{hook}", e)
                break
            finally:
                ctx._hook = None
        self._log.policy_scalars(self.hook_step, self.context.metrics)
        self._settle(failure)

    def _due(self, hook: str) -> list[BasePolicy]:
        """The policies that run ``hook`` now; every worker computes the same list."""
        return [p for p in self._used[hook] if p.runs_at(hook, self.hook_step, self.epoch)]

    def _settle(self, failure: Failure | None) -> None:
        settle(self._agreement, self.context.requests, failure, self.rank, self._apply, lambda: self.detached)

    def _apply(self) -> None:
        ctx = self.context
        self._applier.apply(self, dict(ctx.requests), dict(ctx.requested_by), dict(ctx.reasons), ctx.metrics)
        ctx.metrics.update(self._parameters())

    # --- metrics ---------------------------------------------------------------
    def _parameters(self) -> dict[str, Any]:
        return metrics.parameters(self.size, self.topology, self.batch_size, self.learning_rate)

    def _read_metrics(self) -> dict[str, Any]:
        self.context.metrics = metrics.step_metrics(
            self.access, self._parameters(), self.batch_size, self.size, self._last_elapsed
        )
        self._metrics_read = True
        return self.context.metrics
