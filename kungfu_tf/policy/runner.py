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
    >>> train_step = tf.function(step_fn, input_signature=ds.element_spec)  # batch dim None: one trace
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
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from kungfu_tf.ops import adapt, config, membership, monitor
from kungfu_tf.policy.agreement import CHANGES, FAILED, IDLE, Agreement
from kungfu_tf.policy.base_policy import HOOKS, BasePolicy, overrides
from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.errors import PeerPolicyError, PolicyDisagreementError
from kungfu_tf.policy.hysteresis import Hysteresis
from kungfu_tf.policy.learning_rate_rule import check_rule, scaled_learning_rate
from kungfu_tf.policy.resize_batch import ResizeBatchRule
from kungfu_tf.policy.summary_log import SummaryLog
from kungfu_tf.policy.variable_access import EagerVariableAccess, VariableAccess

# The adaptable settings, in the order they are applied (the learning rate
# may follow the batch size; the topology is independent; the cluster size
# last, since a shrink may detach this worker).
SETTINGS = ("batch_size", "learning_rate", "topology", "size")
PENDING = "pending"  # Decision.refused of a growth that waits for the launcher's joiners


@dataclass(frozen=True)
class Decision:
    """One applied or refused request: at ``step`` (steps completed), ``name`` went ``old`` -> ``new``."""

    step: int
    name: str
    old: Any
    new: Any
    requested_by: str
    reason: str = ""
    refused: str = ""  # why it was refused, or "pending: ..." (a growth waiting for joiners); "" if applied

    def __str__(self) -> str:
        why = f" ({self.reason})" if self.reason else ""
        if self.refused.startswith(PENDING):  # not refused: applied when the joiners are admitted
            return f"step {self.step}: {self.name} {self.old} -> {self.new} {self.refused} [{self.requested_by}{why}]"
        if self.refused:
            return f"step {self.step}: {self.name} {self.old} -> {self.new} refused: {self.refused} [{self.requested_by}{why}]"
        return f"step {self.step}: {self.name} {self.old} -> {self.new} [{self.requested_by}{why}]"


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
        self.lr_rule = check_rule(lr_rule)
        self.hysteresis = Hysteresis(min_dwell_steps, min_relative_change)
        self.rank = config.current_int(config.rank)
        self.size = config.current_int(config.cluster_size)
        if batch_size is not None and batch_size % self.size:
            raise ValueError(f"batch_size {batch_size} (global) is not a multiple of the cluster size {self.size}")
        self.resize_rule = ResizeBatchRule(on_resize, max_global_batch_size)
        # The batch the job wants (per worker, or global: see ResizeBatchRule); set by batch_size= and set_batch_size.
        self._wanted_batch = None if batch_size is None else self.resize_rule.wanted(batch_size, self.size)
        if batch_size is not None:
            batch_size = self.resize_rule.local_batch(self.size, self._wanted_batch) * self.size
        self.batch_size = batch_size
        local = 0 if batch_size is None else batch_size // self.size
        self.access = access if access is not None else EagerVariableAccess(local, optimizer, learning_rate, monitor)
        self.log_dir = log_dir
        self.log_every = log_every
        self.verbose = verbose
        self.history: list[Decision] = []
        # The decision log as text, in order: every Decision and every ctx.log line.
        self.log_lines: list[str] = []
        self._peers: tuple[str, ...] | None = None  # read when first asked for after each refresh_cluster()
        self._asked_size: int | None = None  # a growth asked for and not reached yet
        self._self_peer: str | None = None
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
        self._last_batch_change: int | None = None
        self._step_started: float | None = None
        self._summary: SummaryLog | None = None
        self._logging = False  # rank 0 writes a log (agreed in before_train)
        self._write_failure: tuple[str, BaseException] | None = None
        self._started = False
        self._metrics_read = True  # before the first step: the parameters are all there is
        self._last_elapsed: float | None = None
        self._policies_ran = True  # write the policies' (initial) state at the first save
        self._policies_json: str | None = None
        self._stop_following: Any = None  # removes the elastic apply listener (see _follow_membership)
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

    # --- phases --------------------------------------------------------------
    def before_train(self) -> None:
        """Checks the setup on every worker, then runs ``before_train``."""
        self._check_requirements()
        self.topology = self._read_topology()
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
        self._follow_membership()
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
        self.topology = self._read_topology()
        if self.access.has_learning_rate() and self.access.learning_rate_error() is None:
            self.learning_rate = self.access.read_learning_rate()
        if self.batch_size is not None:
            self.access.assign_local_batch_size(self.batch_size // self.size)
        self._started = True
        self._follow_membership()
        self.context.metrics.update(self._parameters())
        self._save_state()

    def after_train(self) -> None:
        if self._summary is not None:
            try:
                self._summary.flush()
            except Exception as e:  # noqa: BLE001 -- every worker must learn of it
                self._write_failed(e)
        self._run("after_train", force_round=self._logging)
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
        self.context.metrics = self._light_metrics(elapsed)
        self._metrics_read = False
        self._last_elapsed = elapsed
        log_now = self._logging and self.hook_step % self.log_every == 0
        if log_now and self._summary is not None:
            try:
                self._read_metrics()
                self._summary.scalars(self.hook_step, self.context.metrics)
            except Exception as e:  # noqa: BLE001 -- every worker must learn of it
                self._write_failed(e)
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

    # --- internals -----------------------------------------------------------
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

    def _adopt_state(self) -> bool:
        """Continues from a restored (or earlier) state instead of the constructor's values; True if it did."""
        counters, policies = self.access.state.read()
        if counters["steps_done"] <= 0:
            return False
        classes = [type(p).__qualname__ for p in self.policies]
        saved = [entry.get("class") for entry in policies]
        if saved != classes:
            raise ValueError(
                f"the restored policy state is for policies {saved}, but this runner has {classes}: "
                "restore a checkpoint of the same policy list"
            )
        if self.batch_size is not None and counters["batch_size"] > 0:
            if counters["batch_size"] % self.size:
                raise ValueError(
                    f"the restored global batch_size {counters['batch_size']} is not a multiple of the cluster size {self.size}"
                )
            self.batch_size = counters["batch_size"]
            self._wanted_batch = self.resize_rule.wanted(self.batch_size, self.size)
        change = counters["last_batch_change"]
        self._last_batch_change = None if change < 0 else change
        self.steps_done, self.samples, self.epoch = counters["steps_done"], counters["samples"], counters["epoch"]
        self.hook_step = self.steps_done
        for policy, entry in zip(self.policies, policies):
            policy.load_state_dict(entry.get("state", {}))
        self._policies_json = json.dumps(policies, sort_keys=True)
        return True

    def state_counters(self, after_this_step: bool = False) -> dict[str, int]:
        """The counters :attr:`state` holds; ``after_this_step``: as they will be once the running step ends."""
        step = int(after_this_step)
        return {
            "steps_done": self.steps_done + step,
            "samples": self.samples + step * (self.batch_size or 0),
            "epoch": self.epoch,
            "batch_size": self.batch_size or 0,
            "last_batch_change": -1 if self._last_batch_change is None else self._last_batch_change,
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
        return {"counters": counters, "local_batch_size": local, "wanted_batch": self._wanted_batch,
                "logging": self._logging, "policies": [p.state_dict() for p in self.policies]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopts another worker's :meth:`state_dict` (of a runner with the same policies), for this cluster.

        Raises:
            ValueError: the state has another number of policies.
        """
        policies = state.get("policies", [])
        if len(policies) != len(self.policies):
            raise ValueError(
                f"PolicyRunner.load_state_dict: the state holds {len(policies)} policies' states, this runner has "
                f"{len(self.policies)} policies ({', '.join(type(p).__name__ for p in self.policies)})"
            )
        counters = state["counters"]
        self.steps_done, self.samples, self.epoch = counters["steps_done"], counters["samples"], counters["epoch"]
        self.hook_step = self.steps_done
        change = counters["last_batch_change"]
        self._last_batch_change = None if change < 0 else change
        for policy, entry in zip(self.policies, policies):
            policy.load_state_dict(entry)
        self._policies_ran = True
        self._logging = bool(state.get("logging", self._logging))
        self._joined = True
        # The members' batch and learning rate are theirs after the change: adopt, do not scale again.
        with tf.init_scope():
            self.rank, self.size = config.current_int(config.rank), config.current_int(config.cluster_size)
        self._peers = None
        if state.get("wanted_batch") is not None:
            self._wanted_batch = int(state["wanted_batch"])
        local = int(state.get("local_batch_size", 0))
        if self.batch_size is not None and local > 0:
            self.batch_size = local * self.size
            if self._started:
                self.access.assign_local_batch_size(self.batch_size // self.size)
        if self.learning_rate is not None and self.access.has_learning_rate() and self.access.learning_rate_error() is None:
            self.learning_rate = self.access.read_learning_rate()  # the elastic sync assigned the members' before this
        self._save_state()

    def _save_state(self) -> None:
        # The counters change every step (one small assign); the policies'
        # JSON only after phases in which some policy ran.
        counters = self.state_counters()
        text = None
        if self._policies_ran:
            self._policies_ran = False
            entries = [{"class": type(p).__qualname__, "state": p.state_dict()} for p in self.policies]
            text = json.dumps(entries, sort_keys=True)
            if text == self._policies_json:
                text = None
            else:
                self._policies_json = text
        self.access.state.write(counters, text)

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

    def _agree_on_setup(self) -> None:
        # Workers running different policies (or settings) would issue
        # different collectives and hang; say so instead, naming the setting.
        setup = {
            "policies": [type(p).__qualname__ for p in self.policies],
            "batch_size": self.batch_size,
            "log_every": self.log_every,
            "steps_done": self.steps_done,
            "lr_rule": self.lr_rule,
            "on_resize": self.resize_rule.config(),
            "hysteresis": [self.hysteresis.min_dwell_steps, self.hysteresis.min_relative_change],
        }
        # Parameters too, one key each (the error names the one that differs):
        # AdaptiveTopologyPolicy(window=4) against window=5 would hang.
        for i, policy in enumerate(self.policies):
            for key, value in _config_of(policy, i).items():
                setup[f"policies[{i}] {type(policy).__qualname__}.{key}"] = value
        self._require_agreement(setup, "the policy runner's setup")

    def _open_summary(self, failure: tuple[str, BaseException] | None) -> None:
        """Rank 0 creates the event file; every worker learns whether rank 0 logs and whether it (and
        the checks before, ``failure``) succeeded."""
        if failure is None and self.log_dir is not None and self.rank == 0:
            try:
                self._summary = SummaryLog(self.log_dir)
            except Exception as e:  # noqa: BLE001 -- every worker must learn of it
                failure = ("TensorBoard log", OSError(
                    f"log_dir={self.log_dir!r}: cannot create the TensorBoard event file: {type(e).__name__}: {e}"))  # fmt: skip
        # Whether rank 0 logs decides the logging rounds: agreed, since the
        # other ranks may pass log_dir=None.
        self._logging = self._agreement.status(int(self._summary is not None or failure is not None)) > 0
        self._settle(failure)

    def _write_failed(self, error: BaseException) -> None:
        self._summary = None  # no further writes; the next round reports it everywhere
        if self._write_failure is None:
            self._write_failure = ("TensorBoard log", OSError(
                f"log_dir={self.log_dir!r}: writing the TensorBoard events failed: {type(error).__name__}: {error}"))  # fmt: skip

    def _run(self, hook: str, force_round: bool = False) -> None:
        if not self._started:
            raise RuntimeError(f"PolicyRunner.{hook}() before before_train()")
        if self.detached:
            return  # a resize took this worker out of the job: no more hooks, no rounds with the old peers
        used = self._due(hook)
        if self._write_failure is not None and force_round:
            failure, self._write_failure = self._write_failure, None
            self.context.requests.clear()
            self._settle(failure)  # raises on every worker
        if not used:
            if force_round:
                self.context.requests.clear()
                self._settle(None)
            return
        self._policies_ran = True
        self.refresh_cluster()
        if not self._metrics_read:
            self._read_metrics()
        ctx = self.context
        ctx.requests.clear(), ctx.reasons.clear(), ctx.requested_by.clear()
        failure: tuple[str, BaseException] | None = None
        for policy in used:
            ctx._hook, ctx._policy = hook, type(policy).__name__
            try:
                getattr(policy, hook)(ctx)
            except Exception as e:  # noqa: BLE001 -- any failure: every worker must learn of it, see _settle
                failure = (f"{type(policy).__name__}.{hook}", e)
                break
            finally:
                ctx._hook = None
        self._write_policy_metrics()
        self._settle(failure)

    def _write_policy_metrics(self) -> None:
        """Rank 0 writes the numbers the policies put under "<policy>/<name>" as TensorBoard scalars."""
        if self._summary is None:
            return
        values = {k: v for k, v in self.context.metrics.items() if "/" in k}
        if not values:
            return
        try:
            self._summary.scalars(self.hook_step, values)
        except Exception as e:  # noqa: BLE001 -- reported at the next logging round, on every worker
            self._write_failed(e)

    def _settle(self, failure: tuple[str, BaseException] | None) -> None:
        ctx = self.context
        mine = FAILED if failure else (CHANGES if ctx.requests else IDLE)
        status = self._agreement.status(mine)
        if status == IDLE:
            return
        if status == FAILED:
            text = "" if failure is None else f"{failure[0]} failed on rank {self.rank}: {type(failure[1]).__name__}: {failure[1]}"
            texts = [t for t in self._agreement.gather_text(text) if t]
            ctx.requests.clear()
            if failure is not None:
                raise failure[1]
            raise PeerPolicyError("; ".join(texts))
        requests = {name: ctx.requests.get(name) for name in SETTINGS}
        self._require_agreement(requests, "the requested changes")
        self._apply(dict(ctx.requests), dict(ctx.requested_by), dict(ctx.reasons))
        ctx.requests.clear()
        if self.detached:
            return  # a resize took this worker out: it has left the cluster, its collectives would fail
        self._agreement.barrier()

    def _require_agreement(self, values: dict[str, Any], what: str) -> None:
        payload = json.dumps(values, sort_keys=True)
        if self._agreement.agree(payload.encode()):
            return
        by_rank = [json.loads(t) if t else {} for t in self._agreement.gather_text(payload)]
        differing = [k for k in values if len({json.dumps(r.get(k)) for r in by_rank}) > 1]
        detail = "; ".join(
            f"{k}: " + ", ".join(f"rank {r} {_shown(v.get(k))}" for r, v in enumerate(by_rank)) for k in differing
        )
        self.context.requests.clear()
        raise PolicyDisagreementError(
            f"workers differ on {what} ({', '.join(differing)}): {detail}; nothing was changed on any worker"
        )

    def _apply(self, requests: dict[str, Any], by: dict[str, str], reasons: dict[str, str]) -> None:
        step = self.steps_done
        if "batch_size" in requests and requests["batch_size"] != self.batch_size:
            old, new = self.batch_size, requests["batch_size"]
            refusal = self.hysteresis.refusal(step, self._last_batch_change, old, new)
            self._decide(Decision(step, "batch_size", old, new, by["batch_size"], reasons.get("batch_size", ""), refusal or ""))
            if refusal is None:
                if self.lr_rule is not None and "learning_rate" not in requests:
                    # Computed before the batch variable changes (the
                    # statistics belong to the old batch), applied below.
                    requests["learning_rate"] = scaled_learning_rate(
                        self.lr_rule, self.learning_rate, old, new, self.context.metrics
                    )
                    by["learning_rate"] = f"lr_rule={self.lr_rule}"
                self.access.assign_local_batch_size(new // self.size)
                self.batch_size = new
                self._wanted_batch = self.resize_rule.wanted(new, self.size)
                self._last_batch_change = step
        if "learning_rate" in requests and requests["learning_rate"] != self.learning_rate:
            old_lr, new_lr = self.learning_rate, float(requests["learning_rate"])
            self.access.assign_learning_rate(new_lr)
            self.learning_rate = new_lr
            self._decide(Decision(step, "learning_rate", old_lr, new_lr, by["learning_rate"], reasons.get("learning_rate", "")))
        if "topology" in requests and requests["topology"] != self.topology:
            old_t, new_t = self.topology, requests["topology"]
            with tf.init_scope():
                switched = bool(adapt.set_topology(new_t, key="kungfu_policy/set_topology").numpy())
            if not switched:  # cannot happen after our consensus, unless another caller interfered
                raise PolicyDisagreementError(f"workers differ on topology: set_topology({new_t!r}) was refused")
            self.topology = self._read_topology()
            self._decide(Decision(step, "topology", old_t, new_t, by["topology"], reasons.get("topology", "")))
        if "size" in requests and isinstance(requests["size"], list):
            if tuple(requests["size"]) != self.peers:
                self._resize_to(step, requests["size"], by["size"], reasons.get("size", ""))
        elif "size" in requests and (requests["size"] != self.size or self._asked_size not in (None, self.size)):
            # A request for the current size while a growth is pending cancels
            # the growth (kungfu_tf.ops.resize lowers the job's target size).
            self._resize(step, requests["size"], by["size"], reasons.get("size", ""))
        self.context.metrics.update(self._parameters())

    def _resize(self, step: int, new_size: int, by: str, reason: str) -> None:
        # The elastic runtime: imported only when a policy resizes.
        from kungfu_tf.ops.resize import resize

        old = self.size
        with tf.init_scope():
            changed, detached = (bool(t.numpy()) if hasattr(t, "numpy") else bool(t) for t in resize(new_size))
        # A growth waits for the launcher's joiners: the cluster changes at a later
        # step boundary (the elastic check), where refresh_cluster() picks it up.
        if new_size == old:
            pending = ""
            reason = f"{reason}; " if reason else ""
            reason += f"cancels the pending growth to {self._asked_size}"
        else:
            pending = "" if changed or detached else f"{PENDING}: joiners are warming up"
        self._asked_size = new_size if pending else None
        self._decide(Decision(step, "size", old, new_size, by, reason, pending))
        if detached:
            self.detached = True
            return
        if changed:
            self.refresh_cluster()

    def _resize_to(self, step: int, workers: list[str], by: str, reason: str) -> None:
        """``resize(workers=...)``: keeps exactly these members (evicts the others), at once."""
        from kungfu_tf.ops.resize import resize

        old = list(self.peers)
        with tf.init_scope():
            changed, detached = (bool(t.numpy()) if hasattr(t, "numpy") else bool(t) for t in resize(workers=workers))
        # Not applied: another membership change won the race for the version (applied at the next check).
        refused = "" if changed or detached else "lost a race with another membership change; ask again"
        self._decide(Decision(step, "workers", old, list(workers), by, reason, refused))
        if detached:
            self.detached = True
            return
        if changed:
            self.refresh_cluster()

    @property
    def peers(self) -> tuple[str, ...]:
        """The members "host:port" in rank order, as of the last :meth:`refresh_cluster`."""
        if self._peers is None:
            self._peers = tuple(_run_now(membership.cluster_peers))
        return self._peers

    @peers.setter
    def peers(self, value: Sequence[str]) -> None:
        self._peers = tuple(value)

    @property
    def self_peer(self) -> str:
        """This worker's "host:port"."""
        if self._self_peer is None:
            self._self_peer = _run_now(membership.self_peer)
        return self._self_peer

    @property
    def size_bounds(self) -> tuple[int, int] | None:
        """The elastic job's ``(--min-np, --max-np)`` (max 0: unbounded), None outside an elastic job."""
        from kungfu_tf.ops import elastic_membership as em

        if not em.is_elastic():
            return None
        state = em.job_state()
        return int(state.min_size), int(state.max_size)

    def log_line(self, text: str, by: str = "") -> None:
        """Adds ``step N: text [by]`` to the decision log (see :meth:`PolicyContext.log`)."""
        self._write_log_line(self.steps_done, f"step {self.steps_done}: {text}" + (f" [{by}]" if by else ""))

    def _write_log_line(self, step: int, line: str) -> None:
        self.log_lines.append(line)
        if self.verbose and self.rank == 0:
            print(f"[kungfu_tf.policy] {line}", flush=True)
        if self._summary is not None:
            try:
                self._summary.text(step, "decisions", line)
            except Exception as e:  # noqa: BLE001 -- reported at the next logging round, on every worker
                self._write_failed(e)

    def _follow_membership(self) -> None:
        """In an elastic job, reads rank and size again after every membership change this worker applies.

        Changes are applied at step boundaries (``ElasticState.check``, a
        resize); the next step must be counted with the new cluster's global
        batch on every worker, members and joiners alike, or their
        ``state_dict`` (compared by the elastic sync) would differ.
        """
        from kungfu_tf.ops import elastic_membership as em

        if self._stop_following is None and em.is_elastic():
            # First: the batch and learning rate follow the new size before the state syncs.
            self._stop_following = em.add_apply_listener(self._on_membership_change, first=True)

    def _on_membership_change(self, change: Any) -> None:
        self.refresh_cluster()
        if self._step_started is not None:
            self._changed_in_step = True  # see after_step

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
        with tf.init_scope():
            rank, size = config.current_int(config.rank), config.current_int(config.cluster_size)
        if size != self.size and self.batch_size is not None and self._wanted_batch is not None:
            old = self.batch_size
            local = self.resize_rule.local_batch(size, self._wanted_batch)
            self.batch_size = local * size
            if self._started:
                self.access.assign_local_batch_size(local)
            reason = f"the cluster went from {self.size} to {size} workers (on_resize={self.resize_rule.mode})"
            if self.batch_size != old:
                self._decide(Decision(self.steps_done, "batch_size", old, self.batch_size, "resize", reason))
                if self.lr_rule is not None and self._started and self.learning_rate is not None:
                    new_lr = scaled_learning_rate(self.lr_rule, self.learning_rate, old, self.batch_size,
                                                  self.context.metrics)  # fmt: skip
                    self.access.assign_learning_rate(new_lr)
                    self._decide(Decision(self.steps_done, "learning_rate", self.learning_rate, new_lr,
                                          f"lr_rule={self.lr_rule}", reason))  # fmt: skip
                    self.learning_rate = new_lr
        self.rank, self.size = rank, size
        self._peers = None
        if self._asked_size is not None and size >= self._asked_size:
            self._asked_size = None

    def _decide(self, decision: Decision) -> None:
        self.history.append(decision)
        self._write_log_line(decision.step, str(decision))

    def _read_metrics(self) -> None:
        self.context.metrics = self._step_metrics(self._last_elapsed)
        self._metrics_read = True

    def _due(self, hook: str) -> list[BasePolicy]:
        """The policies that run ``hook`` now; every worker computes the same list."""
        return [p for p in self._used[hook] if p.runs_at(hook, self.hook_step, self.epoch)]

    def _read_topology(self) -> str:
        with tf.init_scope():
            return config.topology().numpy().decode()

    def _parameters(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cluster_size": self.size, "topology": self.topology}
        if self.batch_size is not None:
            out["batch_size"] = self.batch_size
        if self.learning_rate is not None:
            out["learning_rate"] = self.learning_rate
        return out

    def _light_metrics(self, elapsed: float | None) -> dict[str, Any]:
        """What costs no op to read: the parameters and the step's wall time."""
        metrics = self._parameters()
        if elapsed is not None and elapsed > 0:
            metrics["step_time"] = elapsed
            if self.batch_size is not None:
                metrics["throughput"] = self.batch_size / elapsed
        return metrics

    def _step_metrics(self, elapsed: float | None) -> dict[str, Any]:
        metrics = {k: _python(v) for k, v in self.access.read_monitor().items()}
        metrics.update(self._parameters())
        if elapsed is not None and elapsed > 0:
            metrics["step_time"] = elapsed
            if self.batch_size is not None:
                metrics["throughput"] = self.batch_size / elapsed
        times = metrics.get("worker_compute_times")
        if self.batch_size is not None and isinstance(times, list):
            local = self.batch_size // self.size
            metrics["worker_throughput"] = [local / t if t > 0 else math.nan for t in times]
        with tf.init_scope():
            metrics["link_rates"] = [float(r) for r in monitor.comm_rates().numpy()]
        return metrics


def _run_now(op: Any) -> Any:
    """A membership op's value (a str or a list of str) now, eagerly or, in a v1 graph, in its own session."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return op()
    with tf.Graph().as_default() as graph:
        value = op()
    with tf.compat.v1.Session(graph=graph) as session:
        out = session.run(value)
    return out.decode() if isinstance(out, bytes) else [p.decode() for p in out]


def _config_of(policy: BasePolicy, index: int) -> Any:
    config = policy.config()
    try:
        json.dumps(config, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise TypeError(f"policies[{index}] {type(policy).__name__}.config() must be JSON-able: {e}") from None
    return config


def _python(value: Any) -> Any:
    """A monitor value as a Python number or list (from numpy or tensors)."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value


def _shown(value: Any) -> str:
    return "no change" if value is None else repr(value)
