"""Joiners that are plain processes (KungFu's elastic scripts): admitted at their first collective.

A KungFu elastic script has no ``ElasticState``: the members call
``resize(n)``, and after ``changed`` they ``broadcast_variables`` from rank 0;
the launcher's new workers run the same script from the top and receive the
state from that broadcast. Here such a job declares itself when it grows:
members without an apply listener (nothing that would sync in step with a
joiner, see :func:`kungfu_tf.ops.resize`) set the job's model signature to
:data:`~kungfu_tf.run.control.job_state.PLAIN_SIGNATURE`.

A joiner process (``KUNGFU_JOINER=1``) looks at the job once, at its first
collective or its first ``kungfu_tf.rank()``/``size()``
(:func:`admit_if_plain`), and waits for the job's signature if none is set
yet:

* the plain signature: it reports ready with it, waits until a committed
  cluster lists it (appended after the members: never rank 0 unless every
  member is gone), applies that version and, if the members wait for more
  workers in ``resize(n)``, waits with them. Then its collective runs with
  the members, as their first collective after the ``resize`` that admitted
  it; its ``rank()``/``size()`` are the real ones from then on.
* a model signature (an ``ElasticState`` job): nothing happens here; the
  joiner warms up alone and ``ElasticState.join`` admits it. Until then
  ``kungfu_tf.rank()``/``size()`` answer :func:`place_before_admission`.

Example (a joiner of ``kungfu-run --elastic -np 1 --max-np 4 python train.py``)::

    kungfu_tf.broadcast_variables(model.variables)   # waits here for admission, then receives rank 0's
"""

from __future__ import annotations

import logging
import os
import threading

import tensorflow as tf

from kungfu_tf.ops import elastic_membership as em

log = logging.getLogger("kungfu_tf.elastic")


class AdmissionError(RuntimeError):
    """A plain-process joiner that the config service refused (the members run another kind of script)."""


_lock = threading.RLock()  # held by the thread that joins; its own collectives re-enter
_undecided: bool | None = None  # None: not looked at yet
_in_admission = False


def _looks_undecided() -> bool:
    global _undecided
    if _undecided is None:
        _undecided = em.is_elastic() and os.environ.get(em.JOINER_ENV, "") == "1"
    return _undecided


def admit_if_plain() -> None:
    """In a joiner process of a plain job: waits for admission and enters the cluster; otherwise nothing.

    Called by every collective and by ``kungfu_tf.rank()``/``size()`` before
    they read anything; after the first call it costs one flag test. Works
    inside a ``tf.function`` being traced (the admission runs eagerly).

    Raises:
        AdmissionError: the config service refused this joiner.
    """
    global _undecided, _in_admission
    if not _looks_undecided():
        return
    with _lock:
        if not _undecided or _in_admission:
            return
        _in_admission = True
        try:
            with tf.init_scope():
                _admit()
        finally:
            _in_admission = False
        _undecided = False


def _job_signature_or_none():
    from kungfu_tf.run.control.job_state import job_finished

    state = em.watcher().wait_for(lambda s: bool(s.signature) or job_finished(s), em.timeout_seconds())
    return None if state is None or not state.signature else state


def _admit() -> None:
    from kungfu_tf.run.control.job_state import PLAIN_SIGNATURE

    if not em.is_joiner():
        return
    state = _job_signature_or_none()
    if state is None:
        log.warning("kungfu elastic: joiner: the job set no model signature within %g s; warming up alone",
                    em.timeout_seconds())  # fmt: skip
        return
    if state.signature != PLAIN_SIGNATURE:
        return  # an ElasticState job: ElasticState.join admits this joiner
    me = em.self_peer()
    em.config_client().joiner_ready(me, PLAIN_SIGNATURE)
    log.info("kungfu elastic: plain joiner %s ready; waiting for admission", me)

    def decided(s) -> bool:
        return me in em.peers_of(s.cluster) or em.rejection_reason(s, me) is not None

    state = em.watcher().wait_for(decided, None)
    reason = em.rejection_reason(state, me)
    if reason is not None:
        raise AdmissionError(reason)
    change = em.enter_admitted(state)
    log.info("kungfu elastic: plain joiner %s admitted at cluster version %d as rank %d of %d",
             me, change.new_version, change.new_peers.index(me), len(change.new_peers))  # fmt: skip


def place_before_admission() -> tuple[int, int] | None:
    """(rank, size) that ``kungfu_tf.rank()``/``size()`` report on a joiner not admitted yet; None once admitted.

    The place it would take if admitted now, alone: after the members of the
    newest committed cluster, so rank = their number (never 0) and
    size = rank + 1. Its warm-up still runs as a cluster of itself: ops read
    inside a traced step (``kungfu_tf.ops.rank()``) say 0 of 1.
    """
    if not em.is_elastic() or not em.is_joiner():
        return None
    members = len(em.config_client().get_job_state().cluster.workers)
    return members, members + 1
