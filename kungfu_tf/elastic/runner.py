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
   returns None as well.

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

import grpc
import tensorflow as tf

from kungfu_tf.elastic.errors import ElasticError
from kungfu_tf.elastic.state import DetachedFromJob, ElasticState
from kungfu_tf.ops import elastic_membership as em

log = logging.getLogger("kungfu_tf.elastic")

R = TypeVar("R")


# Inside a tf.function, TF turns an UnavailableError of an op that is not one
# of its own communication ops into an InternalError with this note.
_REPLACED_UNAVAILABLE = "originally returned UnavailableError"


def is_peer_loss(error: BaseException) -> bool:
    """Whether ``error`` means a peer was lost (crash, or the watcher's interrupt), in eager code or a tf.function."""
    if isinstance(error, tf.errors.UnavailableError):
        return True
    return isinstance(error, tf.errors.InternalError) and _REPLACED_UNAVAILABLE in str(error.message)


def error_summary(error: BaseException) -> str:
    """The line of a TF error that says what happened (not the traceback TF adds in a tf.function)."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines()]
    noise = ("Graph execution error", "Detected at node", "File ", "[[", "Executing non-communication op")
    useful = [line for line in lines if line and not line.startswith(noise)]
    return useful[0] if useful else (lines[0] if lines else type(error).__name__)


def recover(state: ElasticState, error: BaseException) -> em.Change:
    """After a step failed on a lost peer: report it, wait for the next version, apply and sync it."""
    version, _ = em.current()
    me = em.self_peer()
    newest = em.job_state()
    newest_peers = em.peers_of(newest.cluster)
    lost = [p for p in em.lost_peers() if p in newest_peers and p != me]
    reason = error_summary(error)[:300]
    if lost:
        try:
            em.config_client().report_lost(int(newest.cluster.version), lost, reason)
        except grpc.RpcError as e:  # e.g. a report about a version already replaced
            log.warning("kungfu elastic: ReportLost(%d, %s) failed: %s", newest.cluster.version, lost, e)
    timeout = em.timeout_seconds()
    found = em.wait_newer_than(version, timeout)
    if found is None:
        raise ElasticError(
            f"a peer was lost at cluster version {version} ({reason}) and no new cluster version "
            f"was committed within {timeout:.0f} s"
        ) from error
    new_peers = em.cluster_at(version + 1)
    minimum = int(found.min_size)
    if len(new_peers) < minimum:
        raise ElasticError(
            f"the cluster fell below the job's minimum size: version {version + 1} has {len(new_peers)} "
            f"worker(s) ({', '.join(new_peers) or 'none'}), --min-np is {minimum} (after: {reason})"
        ) from error
    log.info("kungfu elastic: recovering from version %d to %d (%s)", version, version + 1, reason)
    return em.apply_version(version + 1, new_peers)


def run(
    fn: Callable[..., R] | None = None, *, warm_up: Callable[[ElasticState], None] | None = None
) -> Callable[..., R | None]:
    """Wraps ``fn(state, *args, **kwargs)`` so that it survives membership changes (see the module docstring).

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
            raise TypeError(f"elastic.run: the first argument must be an ElasticState, got {type(state).__name__}")
        state._in_run = True
        if em.is_elastic():
            em.watcher()  # from the start: a crash must interrupt the first step already
        try:
            if em.is_elastic() and em.is_joiner():
                state.join(warm_up)
            elif not state._has_state:
                state.sync()
            error: BaseException | None = None
            while True:
                try:
                    if error is not None:
                        change = recover(state, error)
                        error = None
                        if change.detached:
                            return None
                    return fn(state, *args, **kwargs)
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
