"""``run``: the Horovod-style wrapper that keeps a training function going through membership changes.

``run(fn)(state, *args)``:

1. a joiner joins (``state.join(warm_up)``); an initial member syncs the
   state (rank 0's everywhere);
2. calls ``fn(state, *args)``;
3. when a peer is lost (``tf.errors.UnavailableError``: a crashed peer, or
   the watcher's interrupt after the config service committed a version
   without it; inside a ``tf.function`` TF reports it as an InternalError
   that says so), recovers: reports the lost peers (ReportLost), waits for
   the next committed version, applies it (a worker not in it returns
   None), syncs the state and calls ``fn`` again, which resumes from
   ``state.step``. A worker whose ``state.check()`` finds it detached
   returns None as well, and so does one whose peers finished training
   (JobState.finished: the job is ending, :class:`JobEndedError`).
4. when ``fn`` returns, reports this member finished (ReportFinished)
   before its runtime says goodbye, so that a peer still inside a step
   sees the job ending rather than a crash.

It fails clearly (:class:`~kungfu_tf.elastic.errors.ElasticError`) when the
cluster fell below the job's ``--min-np`` or no version is committed within
the job's timeout. Other errors (a timeout of a slow but live peer, bugs)
propagate unchanged.

Example::

    @kungfu_tf.elastic.run
    def train(state):
        while state.step < 100:
            state.check()
            step_fn()
            state.commit()

    train(state)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from kungfu_tf.elastic.errors import JobEndedError
from kungfu_tf.elastic.recovery import (  # noqa: F401 -- kungfu_tf.elastic.runner.<name> stays importable
    _report_finished,
    accepts_connections,
    error_summary,
    finished_peers,
    is_peer_loss,
    recover,
)
from kungfu_tf.elastic.state import DetachedFromJob, ElasticState
from kungfu_tf.ops import elastic_membership as em

log = logging.getLogger("kungfu_tf.elastic")

R = TypeVar("R")


def run(
    fn: Callable[..., R] | None = None, *, warm_up: Callable[[ElasticState], None] | None = None
) -> Callable[..., R | None]:
    """Wraps ``fn(state, *args, **kwargs)`` so that it survives membership changes (see the module docstring).

    The state chooses the mode: an ``ElasticState`` applies changes in place
    (this module); an ``ObjectState`` / ``TensorFlowState`` /
    ``TensorFlowKerasState`` re-runs ``fn`` from the last commit after every
    change, as Horovod does (kungfu_tf/elastic/rerun.py).

    ``warm_up(state)`` is what a joiner runs alone before it asks to join
    (trace and run one step on a batch of its own); use ``run(warm_up=...)``
    as a decorator factory, or ``run(fn, warm_up=...)``.

    Example::

        train = kungfu_tf.elastic.run(train_fn, warm_up=lambda s: train_step(*first_batch))
        train(state)
    """
    if fn is None:
        return functools.partial(run, warm_up=warm_up)  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(state: ElasticState, *args: Any, **kwargs: Any) -> R | None:
        if not isinstance(state, ElasticState):
            if hasattr(state, "elastic_state"):  # an ObjectState: Horovod's re-run mode
                from kungfu_tf.elastic import rerun

                return rerun.call(fn, state, args, kwargs, warm_up)
            raise TypeError(
                f"elastic.run: the first argument must be an ElasticState (in place) or an ObjectState (re-run), "
                f"got {type(state).__name__}"
            )
        state._in_run = True
        if em.is_elastic():
            em.watcher()  # from the start: a crash must interrupt the first step already
        try:
            error: BaseException | None = None
            started = False
            while True:
                try:
                    if error is not None:
                        change = recover(state, error)
                        error = None
                        if change.detached:
                            return None
                    elif not started:
                        # Inside the loop: a peer lost during the join's or
                        # the first sync is recovered from like any other.
                        started = True
                        if em.is_elastic() and em.is_joiner():
                            state.join(warm_up)
                        elif not state._has_state:
                            state.sync()
                    result = fn(state, *args, **kwargs)
                    _report_finished()
                    return result
                except JobEndedError as e:
                    log.warning("kungfu elastic: %s", e)
                    _report_finished()
                    return None
                except tf.errors.OpError as e:
                    if not (em.is_elastic() and is_peer_loss(e)):
                        raise
                    log.warning("kungfu elastic: lost a peer at step %d: %s", state.step, error_summary(e))
                    error = e
        except DetachedFromJob:
            return None
        finally:
            state._in_run = False

    return wrapper
