"""``tf.compat.v1`` SessionRunHook: run adaptation policies under ``MonitoredTrainingSession`` (``PolicyHook``).

Example:
    >>> from kungfu_tf.v1 import PolicyHook
    >>> from kungfu_tf.policy import GNSBatchSizePolicy
    >>> hook = PolicyHook([GNSBatchSizePolicy(1024)], batch_size=64, learning_rate=lr_var, monitor=monitor)  # doctest: +SKIP
    >>> with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:  # doctest: +SKIP
    ...     while not sess.should_stop():
    ...         sess.run(train_op)
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.policy_state import COUNTERS

# Room for the policies' state_dict()s as JSON in a v1 graph.
POLICY_STATE_BYTES = 4096
from kungfu_tf.policy.runner import PolicyRunner


class SessionPolicyState:
    """The runner's :class:`~kungfu_tf.policy.policy_state.PolicyState` as variables of the training
    graph (global variables: a ``MonitoredTrainingSession`` with a ``checkpoint_dir`` saves and
    restores them with the model), read in its session.

    Written inside each training ``session.run`` (the hook's ``before_run``
    adds the assignments, with the counters as they will be after that
    step): ``MonitoredTrainingSession`` runs its ``CheckpointSaverHook``
    before user hooks, so a separate run in ``after_run`` would come after
    the save and a checkpoint would hold the state of the step before.
    A checkpoint thus holds the state as that step's run left it, before
    its ``after_run`` policies: counters after the step, the batch size and
    learning rate it ran with, the policies' state from the step before; a
    change the policies request in that ``after_run`` is not in it (a
    resumed run decides again at the policy's next check).
    """

    def __init__(self, access: SessionVariableAccess):
        self._access = access
        self._pending_policies: np.ndarray | None = None
        self.counters = tf.Variable(tf.zeros([len(COUNTERS)], tf.int64), trainable=False, name="kungfu_policy_state/counters")
        # UTF-8 JSON in a zero-padded uint8 buffer, not a tf.string: BroadcastGlobalVariablesHook
        # broadcasts every global variable, and the collectives carry numbers only.
        self.policies = tf.Variable(tf.zeros([POLICY_STATE_BYTES], tf.uint8), trainable=False,
                                    name="kungfu_policy_state/policies")  # fmt: skip

    def build(self) -> None:
        self._counters_in = tf.compat.v1.placeholder(tf.int64, [len(COUNTERS)], name="kungfu_policy_state_counters")
        self._policies_in = tf.compat.v1.placeholder(tf.uint8, [POLICY_STATE_BYTES], name="kungfu_policy_state_policies")
        self._assign_counters = self.counters.assign(self._counters_in)
        self._assign_policies = self.policies.assign(self._policies_in)
        self._read = (self.counters.read_value(), self.policies.read_value())

    def read(self) -> tuple[dict[str, int], list[dict[str, Any]]]:
        counters, policies = self._access._run(self._read)
        text = bytes(policies).rstrip(b"\0").decode("utf-8") or "[]"
        return dict(zip(COUNTERS, (int(v) for v in counters))), json.loads(text)

    def write(self, counters: dict[str, int], policies_json: str | None = None) -> None:
        """Keeps the policies' JSON for the next step's run (the counters there are predicted)."""
        if policies_json is not None:
            raw = policies_json.encode("utf-8")
            if len(raw) > POLICY_STATE_BYTES:
                raise ValueError(
                    f"PolicyHook: the policies' state_dict()s take {len(raw)} bytes as JSON, more than the "
                    f"{POLICY_STATE_BYTES} a v1 graph keeps; keep state_dict() small"
                )
            self._pending_policies = np.frombuffer(raw.ljust(POLICY_STATE_BYTES, b"\0"), np.uint8)

    def run_args(self, counters: dict[str, int]) -> tf.compat.v1.train.SessionRunArgs:
        """The assignments for the training run, ``counters`` being those after it."""
        feed = {self._counters_in: [int(counters[name]) for name in COUNTERS]}
        fetches = [self._assign_counters]
        if self._pending_policies is not None:
            feed[self._policies_in] = self._pending_policies
            fetches.append(self._assign_policies)
        return tf.compat.v1.train.SessionRunArgs(fetches, feed_dict=feed)

    def ran(self) -> None:
        """The training run succeeded: its assignments are done. (A run that failed, on a lost peer
        say, may or may not have assigned: the policies' JSON goes with the run that replaces it,
        so that every member holds the same bytes.)"""
        self._pending_policies = None


class SessionVariableAccess:
    """The runner's reads and assignments as ops of the training graph, run in its session.

    The ops are built in :meth:`build` (the hook's ``begin``, before the
    graph is finalized); the session is set when it is created.
    """

    def __init__(self, local_batch_size: int, learning_rate: Any = None, monitor: Any = None):
        self.local_batch_size = tf.Variable(int(local_batch_size), dtype=tf.int64, trainable=False,
                                            name="kungfu_local_batch_size")  # fmt: skip
        self.monitor = monitor
        self._lr = learning_rate
        self.state = SessionPolicyState(self)
        self.session: tf.compat.v1.Session | None = None
        self._graph: tf.Graph | None = None

    def build(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        if self._graph is graph:
            return
        self._graph = graph
        self.state.build()
        self._batch_in = tf.compat.v1.placeholder(tf.int64, [], name="kungfu_policy_batch_size")
        targets = [self.local_batch_size]
        self._monitor_batch_read = None
        if self.monitor is not None and getattr(self.monitor, "local_batch_size", None) is not None:
            targets.append(self.monitor.local_batch_size)
            self._monitor_batch_read = self.monitor.local_batch_size.read_value()
        self._batch_assign = tf.group(*[t.assign(self._batch_in) for t in targets])
        if self._lr is not None:
            self._lr_in = tf.compat.v1.placeholder(self._lr.dtype, [], name="kungfu_policy_learning_rate")
            self._lr_assign = self._lr.assign(self._lr_in)
            self._lr_read = self._lr.read_value()
        tensors = getattr(self.monitor, "tensors", None) or {}
        self._monitor_read = {k: tf.convert_to_tensor(v) for k, v in tensors.items()}

    def _run(self, fetches: Any, feed: dict | None = None) -> Any:
        if self.session is None:
            raise RuntimeError("PolicyHook: no session yet (the hook drives the runner once the session exists)")
        return self.session.run(fetches, feed)

    def has_learning_rate(self) -> bool:
        return self._lr is not None

    def learning_rate_error(self) -> str | None:
        return None  # a tf.Variable, checked by PolicyHook

    def read_learning_rate(self) -> float:
        return float(self._run(self._lr_read))

    def assign_learning_rate(self, value: float) -> None:
        self._run(self._lr_assign, {self._lr_in: value})

    def assign_local_batch_size(self, value: int) -> None:
        self._run(self._batch_assign, {self._batch_in: value})

    def read_monitor_local_batch_size(self) -> int:
        return 0 if self._monitor_batch_read is None else int(self._run(self._monitor_batch_read))

    def read_monitor(self) -> dict[str, Any]:
        return self._run(self._monitor_read) if self._monitor_read else {}


class PolicyHook(tf.compat.v1.train.SessionRunHook):
    """Drives a :class:`~kungfu_tf.policy.PolicyRunner` around every ``session.run`` of a
    ``MonitoredTrainingSession`` (as KungFu's Listing 1 passes ``PolicyHook([policy])`` to an Estimator).

    Create it inside the training graph: with ``batch_size=`` it creates the
    per-worker batch-size variable ``local_batch_size`` there (feed
    ``kungfu_tf.data.adaptive_batch(ds, hook.local_batch_size)`` through an
    initializable iterator, or slice ``feed_dict`` batches by
    ``hook.current_local_batch_size``). ``learning_rate`` is the
    ``tf.Variable`` the optimizer was built with; ``monitor`` the
    ``GradientMonitor`` of ``SynchronousSGDOptimizerV1``. Each
    ``session.run`` counts as one step; v1 has no epochs (call
    ``hook.runner.before_epoch()``/``after_epoch()`` yourself if you have
    them). The runner (policies included) runs in a thread of its own,
    one call at a time while the training thread waits: eager mode is per
    thread, so the policies and the round's collectives run eagerly as in
    Keras, while the training thread builds and runs its graph (TF2
    behaviour; not with ``tf.compat.v1.disable_eager_execution()``).

    Other keywords are the runner's (``lr_rule``, ``min_dwell_steps``,
    ``min_relative_change``, ``log_dir``, ``verbose``...).

    In an elastic job (``kungfu-run --elastic``), create it before the
    ``ElasticState`` and give it the runner (``ElasticState(..., policy=hook.runner)``),
    and put it after the ``ElasticHook`` (``hooks=[elastic_hook, policy_hook]``):
    the ElasticHook commits each step and applies membership changes before
    the policies run, and a joiner's ElasticHook brings the policies' state
    from the members; the joiner then starts its runner with
    ``PolicyRunner.join_running`` (the members keep their session and run no
    ``before_train`` again). A worker that a policy's resize detaches requests
    stop and calls no policy again.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.v1 import PolicyHook
        >>> with tf.Graph().as_default():                                  # doctest: +SKIP
        ...     lr = tf.Variable(0.1)
        ...     hook = PolicyHook([MyPolicy()], batch_size=64, learning_rate=lr, lr_rule="linear")
        ...     train_op = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss)
        ...     with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook]) as sess:
        ...         for _ in range(100):
        ...             sess.run(train_op, feed(hook.current_local_batch_size))
    """

    def __init__(
        self,
        policies: Sequence[BasePolicy],
        *,
        batch_size: int | None = None,
        learning_rate: Any = None,
        monitor: Any = None,
        **runner_args: Any,
    ):
        if tf.executing_eagerly():
            raise RuntimeError("PolicyHook is for tf.compat.v1 graphs: create it inside `with tf.Graph().as_default():`")
        if learning_rate is not None and not isinstance(learning_rate, tf.Variable):
            raise TypeError(f"PolicyHook: learning_rate must be the tf.Variable the optimizer reads, got {learning_rate!r}")
        from kungfu_tf.ops import config

        size = config.current_int(config.cluster_size)
        local = 0 if batch_size is None or isinstance(batch_size, bool) or not isinstance(batch_size, int) else batch_size // size
        self.access = SessionVariableAccess(local, learning_rate, monitor)
        self.runner = PolicyRunner(policies, batch_size=batch_size, access=self.access, **runner_args)
        self._started = False
        self._eager_thread: ThreadPoolExecutor | None = None

    def _eagerly(self, fn: Callable[[], None]) -> None:
        # Synchronous: the training thread waits, exceptions come back here.
        if self._eager_thread is None:
            self._eager_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kungfu_policy")
        self._eager_thread.submit(fn).result()

    @property
    def local_batch_size(self) -> tf.Variable:
        """The per-worker batch-size variable (a graph variable; for ``adaptive_batch``)."""
        return self.access.local_batch_size

    @property
    def state(self) -> SessionPolicyState:
        """The runner's state as graph variables (saved by the session's ``Saver`` with the model)."""
        return self.access.state

    @property
    def current_local_batch_size(self) -> int | None:
        """The per-worker batch size the next step must use, as a Python int (for ``feed_dict``)."""
        b = self.runner.batch_size
        return None if b is None else b // self.runner.size

    def begin(self) -> None:
        self.access.build()

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        self.access.session = session
        if not self._started:
            self._eagerly(self._start)
            self._started = True

    def _start(self) -> None:
        from kungfu_tf.ops import elastic_membership as em

        if not (em.is_elastic() and os.environ.get(em.JOINER_ENV, "") == "1"):
            self.runner.before_train()
        elif em.is_joiner():
            raise RuntimeError(
                "PolicyHook: this worker joins an elastic job, and the ElasticHook has not joined it yet: put "
                "the PolicyHook after the ElasticHook (hooks=[elastic_hook, policy_hook]); the ElasticHook joins "
                "the job when the session is created, and brings the policies' state (ElasticState(policy=hook.runner))"
            )
        else:  # the members keep their session: no before_train with them (see PolicyRunner.join_running)
            self.runner.join_running()

    def before_run(self, run_context: tf.compat.v1.train.SessionRunContext) -> tf.compat.v1.train.SessionRunArgs:
        self._eagerly(self.runner.before_step)
        return self.access.state.run_args(self.runner.state_counters(after_this_step=True))

    def after_run(self, run_context: tf.compat.v1.train.SessionRunContext, run_values: Any) -> None:
        self.access.state.ran()
        self._eagerly(self.runner.after_step)
        if self.runner.detached:  # a policy's resize took this worker out of the elastic job
            run_context.request_stop()

    def end(self, session: tf.compat.v1.Session) -> None:
        if self._started:
            self._eagerly(self.runner.after_train)
        if self._eager_thread is not None:
            self._eager_thread.shutdown()
            self._eager_thread = None
