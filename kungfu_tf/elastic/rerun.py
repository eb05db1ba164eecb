"""The re-run mode of ``kungfu_tf.elastic.run`` (Horovod's semantics): enter the function again from the last commit.

``kungfu_tf.elastic.run(fn)(state)`` with a Horovod-style state
(:class:`~kungfu_tf.elastic.object_state.ObjectState`, ``TensorFlowState``,
``TensorFlowKerasState`` / ``KerasState``) runs this mode; with an
:class:`~kungfu_tf.elastic.ElasticState` it runs the in-place mode
(kungfu_tf/elastic/runner.py). The loop:

1. the first entry: a pre-warmed joiner joins (waits for admission, then
   syncs the committed state from the members) and runs the reset callbacks;
   an initial member syncs (rank 0's state everywhere);
2. ``fn(state)`` runs;
3. a membership change seen at ``state.commit()`` / ``check_host_updates()``
   (joiners admitted, a resize, a crash the config service already
   committed) raises :class:`HostsUpdatedInterrupt` there: the state was
   rolled back to the last commit and synced on every member (joiners
   included) before it was raised;
4. a lost peer inside a step (``UnavailableError``): the survivors recover
   the next cluster version (``kungfu_tf.elastic.recover``), which rolls
   every value and variable back to its last commit and syncs it (a member
   that committed once more than another is the source of that commit);
5. after 3 or 4 the reset callbacks run (``state.on_reset()``: the learning
   rate follows ``kungfu_tf.size()`` there) and ``fn`` is entered again; a
   worker the change detached returns None.

Unlike Horovod, the state is synced when the change is applied, not at each
entry (the joiners are admitted at that point), and a change always restores
the last commit first, so after ``check_host_updates()`` called between
commits the variables go back to the commit with the Python values.

Example::

    import kungfu_tf as hvd

    @hvd.elastic.run
    def train(state):
        for state.batch in range(state.batch, steps):
            train_step(next_batch())
            state.commit()

    train(hvd.elastic.TensorFlowKerasState(model, optimizer, batch=0))
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from kungfu_tf.elastic.errors import JobEndedError
from kungfu_tf.elastic.state import DetachedFromJob
from kungfu_tf.ops import elastic_membership as em

log = logging.getLogger("kungfu_tf.elastic")

R = TypeVar("R")


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``commit()`` / ``check_host_updates()`` of a re-run state after a membership change was applied.

    The state is the last commit, synced on every member; ``kungfu_tf.elastic.run`` runs the reset
    callbacks and enters the function again. ``change`` is the applied :class:`~kungfu_tf.elastic.Change`.
    """

    def __init__(self, change: em.Change) -> None:
        super().__init__(f"the cluster changed: version {change.old_version} -> {change.new_version} "
                         f"({len(change.old_peers)} -> {len(change.new_peers)} workers)")  # fmt: skip
        self.change = change


def run(fn: Callable[..., R] | None = None, *, warm_up: Callable[[Any], None] | None = None) -> Callable[..., R | None]:
    """Wraps ``fn(state, *args, **kwargs)``: re-entered from the last commit after every change (module docstring).

    ``warm_up(state)``: what a pre-warmed joiner runs alone before it asks to
    join (Horovod scripts warm up at the top instead, before ``run``).
    """
    if fn is None:
        return functools.partial(run, warm_up=warm_up)  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> R | None:
        return call(fn, state, args, kwargs, warm_up)

    return wrapper


def call(fn: Callable[..., R], state: Any, args: tuple, kwargs: dict, warm_up: Callable[[Any], None] | None) -> R | None:
    """One run of ``fn`` in the re-run mode (what :func:`run`'s wrapper and ``kungfu_tf.elastic.run`` call)."""
    from kungfu_tf.elastic.recovery import (
        _report_finished,
        error_summary,
        is_peer_loss,
        recover,
    )

    if not hasattr(state, "on_reset") or not hasattr(state, "elastic_state"):
        raise TypeError(f"elastic.run (re-run mode): the first argument must be an ObjectState, got {type(state).__name__}")
    elastic_state = state.elastic_state
    state._in_run = True
    if em.is_elastic():
        em.watcher()  # from the start: a crash must interrupt the first step already
    try:
        error: BaseException | None = None
        started = False
        reset = False
        while True:
            try:
                if error is not None:
                    change = recover(elastic_state, error)  # restores the last commit, then syncs
                    error = None
                    if change.detached:
                        return None
                    reset = True
                elif not started:
                    started = True
                    if em.is_elastic() and em.is_joiner():
                        elastic_state.join(warm_up)
                        reset = True  # the learning rate of the new size, as the members' reset sets it
                    elif not elastic_state._has_state:
                        state.sync()
                if reset:
                    reset = False
                    state._pending_change = None
                    state.on_reset()
                state._rerun_requested = False
                result = fn(state, *args, **kwargs)
                if state._rerun_requested:
                    continue  # a Keras callback ended a resumed epoch early: fit again from the next one
                _report_finished()
                return result
            except HostsUpdatedInterrupt as e:
                log.info("kungfu elastic: %s; entering %s again from the last commit", e, getattr(fn, "__name__", "fn"))
                reset = True
            except JobEndedError as e:
                log.warning("kungfu elastic: %s", e)
                _report_finished()
                return None
            except tf.errors.OpError as e:
                if not (em.is_elastic() and is_peer_loss(e)):
                    raise
                log.warning("kungfu elastic: lost a peer: %s; rolling back to the last commit", error_summary(e))
                error = e
    except DetachedFromJob:
        return None
    finally:
        state._in_run = False
