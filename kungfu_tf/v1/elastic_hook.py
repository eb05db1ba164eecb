"""``tf.compat.v1`` sessions in an elastic job: ``ElasticHook``, ``ElasticSessionCreator``, ``session_variables``.

Example (``kungfu-run --elastic -np 2 python train_v1.py``)::

    import kungfu_tf.elastic as elastic
    from kungfu_tf.data import ElasticSampler
    from kungfu_tf.v1 import ElasticHook, ElasticSessionCreator, session_variables

    with tf.Graph().as_default():
        x_in, y_in, train_op = build_graph()      # SynchronousSGDOptimizerV1(...).minimize(...)
        sampler = ElasticSampler(len(x), batch_size=32, seed=1)
        state = elastic.ElasticState(session_variables(tf.compat.v1.global_variables()), sampler=sampler)
        hook = ElasticHook(state, sampler, feed=lambda ids: {x_in: x[ids], y_in: y[ids]})
        with tf.compat.v1.train.MonitoredSession(ElasticSessionCreator(), hooks=[hook]) as sess:
            while state.epoch < 5:
                sess.run(train_op)                # the hook feeds this worker's share of the step
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import config

# What MonitoredSession's _RecoverableSession treats as a preemption (it closes
# the session and creates a new one): for us, a lost peer.
PEER_LOSS_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError)


class SessionVariable:
    """A graph variable read and assigned through a session, as the elastic state needs (``numpy``/``assign``).

    ``kungfu_tf.elastic.ElasticState`` moves variables as bytes with
    ``numpy()`` and ``assign(value)``; a ``tf.compat.v1`` graph variable
    has neither outside its session. Build these while building the graph
    (with :func:`session_variables`); :class:`ElasticHook` gives them the
    session.
    """

    def __init__(self, variable: Any):
        self.variable = variable
        self.name: str = variable.name
        self.dtype = variable.dtype.base_dtype
        self.shape = variable.shape
        self._read = tf.identity(variable)
        self._value_in = tf.compat.v1.placeholder(self.dtype, self.shape)
        self._assign = variable.assign(self._value_in)
        self.session: tf.compat.v1.Session | None = None

    def _session(self) -> tf.compat.v1.Session:
        if self.session is None:
            raise RuntimeError(f"SessionVariable {self.name}: no session yet (ElasticHook binds it when the session is created)")
        return self.session

    def numpy(self) -> np.ndarray:
        return self._session().run(self._read)

    def assign(self, value: Any) -> None:
        self._session().run(self._assign, {self._value_in: value})


def session_variables(variables: Sequence[Any]) -> list[SessionVariable]:
    """Wraps graph variables for ``ElasticState`` (call it while building the graph, before the session).

    Example:
        >>> import tensorflow as tf
        >>> with tf.Graph().as_default():
        ...     v = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.zeros_initializer())
        ...     [s.name for s in session_variables([v])]
        ['w:0']
    """
    if tf.executing_eagerly():
        raise RuntimeError("session_variables is for tf.compat.v1 graphs: call it inside `with tf.Graph().as_default():`")
    return [SessionVariable(v) for v in variables]


class _KeptSession:
    """A session that survives MonitoredSession's recovery: ``close()`` while a peer-loss error is being
    handled keeps it (and its variables) open; any other ``close()`` closes it."""

    def __init__(self, session: tf.compat.v1.Session):
        self._session = session

    def close(self) -> None:
        if isinstance(sys.exc_info()[1], PEER_LOSS_ERRORS):
            return  # _RecoverableSession is about to ask for a new session: it gets this one again
        self._session.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class ElasticSessionCreator(tf.compat.v1.train.SessionCreator):
    """A session creator for ``MonitoredSession`` that keeps the session when a peer is lost.

    ``MonitoredSession`` treats ``UnavailableError``/``AbortedError`` as a
    preemption: it closes the session and creates a new one, which
    initializes every variable again (or restores the last checkpoint), so
    the training state would be lost. A lost peer is such an error here;
    this creator hands back the *same* session instead (variables, optimizer
    slots and global step as the failed step left them: it was applied
    entirely or not at all), and :class:`ElasticHook`, told of the new
    session, recovers the cluster and syncs the state with the survivors.
    ``MonitoredSession`` then runs the failed ``run`` again, asking the
    hooks for their feeds again (the hook feeds the batch of the new
    cluster). Arguments are ``ChiefSessionCreator``'s; or give
    ``session_creator=`` (another creator, whose session is kept).

    Example:
        >>> creator = ElasticSessionCreator(config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1))
    """

    def __init__(self, scaffold: Any = None, master: str = "", config: Any = None, checkpoint_dir: str | None = None,
                 session_creator: tf.compat.v1.train.SessionCreator | None = None):  # fmt: skip
        self._inner = session_creator or tf.compat.v1.train.ChiefSessionCreator(
            scaffold=scaffold, master=master, config=config, checkpoint_dir=checkpoint_dir)  # fmt: skip
        self._kept: _KeptSession | None = None
        self.sessions_created = 0  # 1 + the recoveries it served with the kept session

    def create_session(self) -> Any:
        self.sessions_created += 1
        if self._kept is None or self._kept._session._closed:
            self._kept = _KeptSession(self._inner.create_session())
        return self._kept


class ElasticHook(tf.compat.v1.train.SessionRunHook):
    """Drives ``kungfu_tf.elastic.ElasticState`` around every ``run`` of a ``MonitoredSession``.

    * Session created (first time): a joiner joins the job (fetching the
      state from the members); a starting worker syncs (rank 0's state).
    * ``before_run``: with a ``sampler`` and ``feed``, feeds this worker's
      share of the next step, ``feed(ids)`` with ``ids =
      sampler.next_indices(rank, size)``.
    * ``after_run`` (the step succeeded): ``sampler.commit(size)``,
      ``state.commit()``, then every ``check_every`` steps
      ``state.check()``: a committed resize, grow or crash is applied at this
      step boundary, the state synced, and the next ``before_run`` feeds the
      new cluster's share. A worker that a resize detached requests stop
      (``sess.should_stop()`` becomes True; the loop ends).
    * A peer lost during a step: ``MonitoredSession`` asks for a new session;
      with :class:`ElasticSessionCreator` it is the same one, and this hook
      (``after_create_session`` again) reports the lost peer, waits for the
      survivors' cluster version, applies it and syncs the state; the step
      then runs again on the survivors. A worker found detached there ends
      its loop with ``OutOfRangeError``, which ``MonitoredSession`` treats as
      the end of the input (clean exit).

    The state's variables must be :func:`session_variables`; the state's
    collectives run eagerly in a thread of the hook (eager mode is per
    thread; the training thread builds and runs the graph), one call at a
    time while the training thread waits.

    Args:
        state: the ``ElasticState`` (variables from :func:`session_variables`).
        sampler: the ``ElasticSampler`` of the data (also in the state).
        feed: ``feed(ids) -> feed_dict`` for the step's sample ids.
        check_every: membership check every this many steps.
        warm_up: ``warm_up(session)``, what a joiner runs alone before it
            asks to join (e.g. one ``session.run`` of the step on a batch;
            it runs in the hook's thread, the hooks are not called).

    Raises:
        TypeError: a variable of the state is not a :class:`SessionVariable`;
            ``feed`` without ``sampler`` or the other way round.
    """

    def __init__(self, state: Any, sampler: Any = None, feed: Callable[[np.ndarray], dict] | None = None,
                 check_every: int = 1, warm_up: Callable[[tf.compat.v1.Session], None] | None = None):  # fmt: skip
        if (sampler is None) != (feed is None):
            raise TypeError("ElasticHook: give both sampler= and feed= (the hook feeds each step's ids), or neither")
        if isinstance(check_every, bool) or not isinstance(check_every, int) or check_every <= 0:
            raise ValueError(f"ElasticHook: check_every must be a positive int, got {check_every!r}")
        self.state = state
        self.sampler = sampler
        self.feed = feed
        self.check_every = check_every
        self.warm_up = warm_up
        self.detached = False
        self.changes: list[Any] = []  # every membership change applied, in order
        self.recoveries = 0
        self.rank, self.size = 0, 1
        self.fed: tuple[np.ndarray, int, int] | None = None  # (ids, rank, size) of the last step fed
        self._sessions = 0
        self._seen_change: Any = None
        self._eager_thread: ThreadPoolExecutor | None = None

    def eagerly(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn()`` eagerly in the hook's thread and returns its result (the training thread waits).

        For eager calls between steps, e.g. ``hook.eagerly(lambda: kungfu_tf.ops.resize(2))``:
        the hook sees the change at the next ``before_run`` and feeds the new
        cluster's share (or ends the loop of a detached worker).
        """
        if self._eager_thread is None:
            self._eager_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kungfu_elastic")
        return self._eager_thread.submit(fn).result()

    _eagerly = eagerly

    def begin(self) -> None:
        for i, v in enumerate(self.state.variables()):
            if not isinstance(v, SessionVariable):
                raise TypeError(
                    f"ElasticHook: the state's variables[{i}] ({getattr(v, 'name', v)!r}) is not a SessionVariable; "
                    "build the state with ElasticState(kungfu_tf.v1.session_variables(tf.compat.v1.global_variables()), ...)"
                )

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        for v in self.state.variables():
            v.session = session
        self._sessions += 1
        if self._sessions == 1:
            self._eagerly(lambda: self._start(session))
        else:
            self.recoveries += 1
            self._eagerly(self._recover)
        self._seen_change = getattr(self.state, "last_change", None)
        self._read_cluster()

    def _start(self, session: tf.compat.v1.Session) -> None:
        from kungfu_tf.ops import elastic_membership as em

        if em.is_elastic() and em.is_joiner():
            warm_up = None if self.warm_up is None else (lambda state: self.warm_up(session))
            change = self.state.join(warm_up)
            if change is not None:
                self.changes.append(change)
        else:
            self.state.sync()

    def _recover(self) -> None:
        from kungfu_tf.elastic import recover

        change = recover(self.state, RuntimeError("a peer was lost during session.run (the session was kept)"))
        self.changes.append(change)
        self.detached = bool(change.detached)

    def _read_cluster(self) -> None:
        if not self.detached:
            self.rank, self.size = self._eagerly(lambda: (config.current_int(config.rank), config.current_int(config.cluster_size)))

    def before_run(self, run_context: tf.compat.v1.train.SessionRunContext) -> tf.compat.v1.train.SessionRunArgs | None:
        change = getattr(self.state, "last_change", None)
        if change is not self._seen_change:  # applied between steps by someone else (hook.eagerly(resize))
            self._seen_change = change
            self.changes.append(change)
            self.detached = self.detached or bool(change.detached)
            self._read_cluster()
        if self.detached:
            raise tf.errors.OutOfRangeError(None, None, "this worker was detached from the elastic job")
        if self.sampler is None:
            return None
        ids = self.sampler.next_indices(self.rank, self.size)
        self.fed = (ids, self.rank, self.size)
        return tf.compat.v1.train.SessionRunArgs(None, feed_dict=self.feed(ids))

    def after_run(self, run_context: tf.compat.v1.train.SessionRunContext, run_values: Any) -> None:
        if self.sampler is not None:
            self.sampler.commit(self.size)
            self.state.epoch = self.sampler.epoch
        self.state.commit()
        if self.state.step % self.check_every:
            return
        change = self._eagerly(self.state.check)
        self._seen_change = getattr(self.state, "last_change", None)
        if change is None:
            return
        self.changes.append(change)
        if change.detached:
            self.detached = True
            run_context.request_stop()
        else:
            self._read_cluster()

    def end(self, session: tf.compat.v1.Session) -> None:
        if self._eager_thread is not None:
            self._eager_thread.shutdown()
            self._eager_thread = None
