"""Recovering from a lost peer: report it, wait for the next cluster version, apply it.

What both elastic modes do after a step failed on a lost peer: the in-place
mode (:func:`kungfu_tf.elastic.runner.run` with an ``ElasticState``) and the
re-run mode (:mod:`kungfu_tf.elastic.rerun`). ``recover`` reports only peers
whose port no longer accepts connections, restarts the version when nobody
was lost, and ends the job's loop (:class:`JobEndedError`) once a member
finished training.
"""

from __future__ import annotations

import logging
import re
import socket
import time

import grpc
import tensorflow as tf

from kungfu_tf.elastic.errors import ElasticError, JobEndedError
from kungfu_tf.elastic.state import ElasticState
from kungfu_tf.ops import elastic_membership as em

log = logging.getLogger("kungfu_tf.elastic")

# How long a worker that saw no peer die waits for someone's ReportLost
# before it restarts the version (a failure that lost nobody).
RESTART_GRACE_SECONDS = 3.0


# Inside a tf.function, TF turns an UnavailableError of an op that is not one
# of its own communication ops into an InternalError with this note; a
# tf.py_function (resize in a tf.function) reports one raised inside it as an
# UnknownError that starts the message with the original error's name.
_REPLACED_UNAVAILABLE = ("originally returned UnavailableError", "UnavailableError: ")


def is_peer_loss(error: BaseException) -> bool:
    """Whether ``error`` means a peer was lost (crash, or the watcher's interrupt), in eager code or a tf.function."""
    if isinstance(error, tf.errors.UnavailableError):
        return True
    if isinstance(error, (tf.errors.InternalError, tf.errors.UnknownError)):
        message = str(error.message)
        return any(note in message for note in _REPLACED_UNAVAILABLE)
    return False


def error_summary(error: BaseException) -> str:
    """The line of a TF error that says what happened (not the traceback TF adds in a tf.function)."""
    lines = [line.strip() for line in str(getattr(error, "message", error)).splitlines()]
    noise = ("Graph execution error", "Detected at node", "File ", "[[", "Executing non-communication op", "Traceback")
    useful = [line for line in lines if line and not line.startswith(noise)]
    line = useful[0] if useful else (lines[0] if lines else type(error).__name__)
    line = re.sub(r"^\w+Error: ", "", line)  # a py_function's wrapping
    line = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", line)  # eager ops: where TF ran it
    return re.sub(r"\s*\[Op:[^\]]*\].*$", "", line)


def accepts_connections(peer: str, duration: float = 1.0, interval: float = 0.1) -> bool:
    """Whether ``peer`` ("host:port") keeps accepting TCP connections for ``duration`` seconds.

    A killed process's listening port closes while its connections report
    EOF, so a single probe right after the EOF can still get in; a port that
    refuses (or times out) once within ``duration`` belongs to a gone process.
    """
    host, _, port = peer.rpartition(":")
    deadline = time.monotonic() + duration
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=max(interval, 0.5)):
                pass
        except OSError:
            return False
        if time.monotonic() >= deadline:
            return True
        time.sleep(interval)


def finished_peers(job_state, peers: tuple[str, ...], me: str) -> list[str]:
    """The members among ``peers`` (other than ``me``) that ``job_state`` lists as finished."""
    finished = {em.peer_of(p) for p in job_state.finished}
    return [p for p in peers if p in finished and p != me]


def _end_if_finished(job_state, version: int, peers: tuple[str, ...], me: str, error: BaseException) -> None:
    done = finished_peers(job_state, peers, me)
    if done:
        raise JobEndedError(
            f"the job is ending: {', '.join(done)} finished training (members of cluster version {version}), "
            "so this worker stops here instead of waiting for a new version (none is committed once a member "
            f"finished); its step failed with: {error_summary(error)[:200]}"
        ) from error


def recover(state: ElasticState, error: BaseException) -> em.Change:
    """After a step failed on a lost peer: report it, wait for the next version, apply and sync it.

    Raises:
        JobEndedError: a member of this worker's cluster finished training
            (JobState.finished): the job is ending, no version will come.
        ElasticError: below --min-np, or nothing committed within the timeout.
    """
    version, peers = em.current()
    me = em.self_peer()
    # Asked now, not the watcher's copy: a peer that finished reported it
    # (ReportFinished) right before the goodbye that failed this step.
    newest = em.config_client().get_job_state()
    _end_if_finished(newest, version, peers, me, error)
    newest_peers = em.peers_of(newest.cluster)
    suspects = [p for p in em.lost_peers() if p in newest_peers and p != me]
    # A broken connection alone does not prove a crash: report only peers
    # whose port no longer accepts connections (their process is gone, or
    # their host unreachable); a live one is kept and the version restarted.
    lost = [p for p in suspects if not accepts_connections(p)]
    if len(lost) < len(suspects):
        log.warning("kungfu elastic: %s still accept connections: not reported as lost", sorted(set(suspects) - set(lost)))
    reason = error_summary(error)[:300]
    if lost:
        try:
            answer = em.config_client().report_lost(int(newest.cluster.version), lost, reason)
        except grpc.RpcError as e:  # e.g. a report about a version already replaced
            log.warning("kungfu elastic: ReportLost(%d, %s) failed: %s", newest.cluster.version, lost, e)
        else:
            _end_if_finished(answer, version, peers, me, error)  # it committed nothing: they finished

    def next_version_or_end(timeout: float):
        # A newer version, or a member that finished (then none will come).
        found = em.watcher().wait_for(
            lambda s: s.cluster.version > version or bool(finished_peers(s, peers, me)), timeout
        )
        if found is not None:
            _end_if_finished(found, version, peers, me, error)
        return found

    timeout = em.timeout_seconds()
    found = None
    if not lost:
        # Nobody this worker knows of died: a peer's report (or the
        # launcher's) may come; if none does, the failure lost nobody and
        # the members restart this version instead of waiting for a timeout.
        # (No grace when the peers that broke a connection are all alive.)
        found = next_version_or_end(0.0 if suspects else RESTART_GRACE_SECONDS)
        if found is None:
            log.warning("kungfu elastic: no peer lost at version %d; restarting it (%s)", version, reason)
            em.restart_version(version, peers)
    if found is None:
        found = next_version_or_end(timeout)
    if found is None:
        raise ElasticError(
            f"a peer was lost at cluster version {version} ({reason}; lost here: {lost or 'none'}) and no new "
            f"cluster version was committed within {timeout:.0f} s"
        ) from error
    if not lost and not em.stop_members_of(version, peers):
        raise ElasticError(
            f"cluster version {version} failed without a lost peer ({reason}) and the newer versions only admitted "
            f"joiners; restarting the newest failed {em.STOP_ATTEMPTS} times, so the members still in version "
            f"{version} cannot be stopped"
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


def _report_finished() -> None:
    """Tells the config service this member finished (ReportFinished), before its runtime says goodbye.

    Otherwise a peer still inside a collective may see the goodbye first and
    report it lost; with it, that peer's recovery sees the job is ending.
    The launcher reports it too when the process exits 0 (a repeat is a no-op).
    """
    if not em.is_elastic():
        return
    version, peers = em.current()
    me = em.self_peer()
    if me not in peers or version < 1:
        return  # detached (or never joined): not a member
    try:
        em.config_client().report_finished(me)
    except grpc.RpcError as e:
        log.warning("kungfu elastic: ReportFinished(%s) failed: %s", me, e)
