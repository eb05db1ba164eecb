"""This worker's membership of an elastic job: the config service, its watcher, and applying versions.

An elastic job (``kungfu-run --elastic``) keeps its versioned cluster in the
launcher's config service (kungfu_tf/run/control/config_server.py). Every worker:

* talks to it with one :class:`~kungfu_tf.run.control.config_server.ConfigClient`
  built from ``KUNGFU_CONFIG_SERVER``, ``KUNGFU_JOB_SECRET`` and
  ``KUNGFU_JOB_ID`` (:func:`config_client`);
* runs a background watcher thread (a ``WaitJobState`` long poll) that keeps
  the newest committed cluster version it has seen (:func:`newest_seen`) and,
  when a committed version lacks members of the version this worker uses
  (a crash: the launcher or a survivor reported it), interrupts the runtime
  so that a step blocked on the dead peer fails at once
  (``UnavailableError``) instead of waiting for the timeout;
* applies committed versions only at points every member agrees on
  (:func:`adopt_next`, :func:`apply_version`), one version at a time, so that
  every member, joiners included, goes through the same sequence;
* after a failure that lost nobody (a connection that broke while every
  peer lives), commits the same members as the next version
  (:func:`restart_version`): the watchers interrupt the members still
  waiting, and all apply it as after a crash.

Changing the membership never happens inside a training step: a step sees
the old cluster or the new one, never a mix (the runtime swaps atomically).
After a version is applied, the listeners registered with
:func:`add_apply_listener` run (the elastic state's sync, kungfu_tf/elastic):
this module lives in the ops layer and must not import that one.

Example (inside ``kungfu-run --elastic``)::

    from kungfu_tf.ops import elastic_membership as em
    change = em.adopt_next()     # every member calls it at the same step
    if change is not None and change.detached:
        return                   # this worker left the job
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from kungfu_tf.ops.collective import all_reduce

if TYPE_CHECKING:
    from kungfu_tf.proto import config_pb2

CONFIG_SERVER_ENV = "KUNGFU_CONFIG_SERVER"
ELASTIC_ENV = "KUNGFU_ELASTIC"
JOINER_ENV = "KUNGFU_JOINER"
SECRET_ENV = "KUNGFU_JOB_SECRET"
JOB_ID_ENV = "KUNGFU_JOB_ID"
TIMEOUT_ENV = "KUNGFU_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 120.0  # the runtime's default (ops/runtime/runtime.h)
# How long one long poll of the watcher waits on the server before asking again.
LONG_POLL_SECONDS = 10.0
# The all-reduce of seen versions runs on STAR: one round trip, any size.
SEEN_KEY = "kungfu/elastic/seen"
WAIT_SEEN_KEY = "kungfu/elastic/wait/seen"

log = logging.getLogger("kungfu_tf.elastic")


def _membership():
    # Imported when first needed: importing kungfu_tf.ops (which exports
    # resize) must not load the membership ops before anything uses them.
    from kungfu_tf.ops import membership

    return membership


class NotElasticError(RuntimeError):
    """An elastic operation in a job that was not started with ``kungfu-run --elastic``."""


@dataclasses.dataclass(frozen=True)
class Change:
    """One applied membership change, as every member saw it.

    ``detached``: this worker is not in the new cluster (it has left the job).
    ``joined``: this worker was not in the old cluster (a joiner).
    """

    old_version: int
    new_version: int
    old_peers: tuple[str, ...]
    new_peers: tuple[str, ...]
    self_peer: str

    @property
    def detached(self) -> bool:
        return self.self_peer not in self.new_peers

    @property
    def joined(self) -> bool:
        return self.self_peer not in self.old_peers

    @property
    def lost(self) -> tuple[str, ...]:
        """Members of the old cluster that are not in the new one."""
        return tuple(p for p in self.old_peers if p not in self.new_peers)

    @property
    def added(self) -> tuple[str, ...]:
        """Members of the new cluster that were not in the old one."""
        return tuple(p for p in self.new_peers if p not in self.old_peers)


def is_elastic() -> bool:
    """Whether this worker belongs to an elastic job (``KUNGFU_CONFIG_SERVER`` is set)."""
    return bool(os.environ.get(CONFIG_SERVER_ENV))


def is_joiner() -> bool:
    """Whether this process was started as a joiner (``KUNGFU_JOINER=1``) and has not joined yet."""
    return os.environ.get(JOINER_ENV, "") == "1" and not _state.joined


def detached() -> bool:
    """Whether this worker has left the job: it applied a cluster version without itself (KungFu's ``detached()``).

    False outside an elastic job and on a joiner not admitted yet.
    """
    with _state.lock:
        return _state.version is not None and bool(_state.self_peer) and _state.self_peer not in _state.peers


def has_apply_listeners() -> bool:
    """Whether something in this process syncs after each applied version (an ElasticState, a policy runner).

    Without one, a joiner need not run any sync in step with the members:
    the job's workers are plain processes (see :func:`kungfu_tf.ops.resize`).
    """
    with _state.lock:
        return bool(_state.listeners)


def timeout_seconds() -> float:
    """The job's timeout (``KUNGFU_TIMEOUT``, else the runtime's default of 120 s)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    return float(text) if text else DEFAULT_TIMEOUT_SECONDS


def _require_elastic(what: str) -> str:
    address = os.environ.get(CONFIG_SERVER_ENV, "")
    if not address:
        raise NotElasticError(
            f"{what} needs an elastic job: start the workers with 'kungfu-run --elastic' "
            f"({CONFIG_SERVER_ENV} is not set)"
        )
    return address


def peers_of(cluster) -> tuple[str, ...]:
    """The workers of a ``Cluster`` message as "host:port" strings, in rank order."""
    from kungfu_tf.run.control.peer_string import cluster_peers

    return tuple(cluster_peers(cluster))


def peer_of(peer) -> str:
    """A ``PeerID`` message as "host:port"."""
    from kungfu_tf.run.control.peer_string import peer_string

    return peer_string(peer)


def rejection_reason(state, me: str) -> str | None:
    """Why the config service rejected joiner ``me`` in job ``state``, or None if it did not."""
    from kungfu_tf.proto import config_pb2

    for joiner in state.joiners:
        if peer_of(joiner.peer) == me and joiner.state == config_pb2.Joiner.REJECTED:
            return joiner.reason or f"joiner {me} was rejected by the config service"
    return None


class _MembershipState:
    """The process-wide state of this module (one per worker)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.client = None
        self.watcher: _Watcher | None = None
        self.version: int | None = None  # the applied version (None: not read yet)
        self.peers: tuple[str, ...] = ()
        self.self_peer = ""
        self.joined = False
        self.listeners: list[Callable[[Change], None]] = []
        # Inside resize(): the version it may commit (current + 1) drops members
        # on purpose; it is not a crash. 0 outside resize().
        self.own_commit = 0
        # Inside a resize(wait=True) loop: the size it waits for (0 outside).
        # Every applied version agrees on it (max), so that joiners admitted
        # while the members wait learn it and wait with them (see apply_version).
        self.wait_target = 0
        # The wait target this worker learned from the members when it applied
        # a version outside a wait loop (a joiner): join() then waits with them.
        self.pending_wait = 0

    def ensure_current(self) -> None:
        with self.lock:
            if self.version is None:
                self.self_peer = _membership().self_peer()
                self.peers = tuple(_membership().cluster_peers())
                from kungfu_tf.ops.config import cluster_version

                self.version = int(cluster_version())


_state = _MembershipState()


def config_client():
    """The worker's ConfigClient (one per process), built from the environment.

    Raises:
        NotElasticError: ``KUNGFU_CONFIG_SERVER`` is not set.
    """
    address = _require_elastic("the config service")
    with _state.lock:
        if _state.client is None:
            from kungfu_tf.run.control.config_server import ConfigClient

            _state.client = ConfigClient(
                address,
                secret=os.environ.get(SECRET_ENV, ""),
                job_id=os.environ.get(JOB_ID_ENV, ""),
            )
        return _state.client


def current() -> tuple[int, tuple[str, ...]]:
    """(version, peers) of the cluster this worker uses (its runtime's, until it applies another)."""
    _state.ensure_current()
    with _state.lock:
        return _state.version, _state.peers  # type: ignore[return-value]


def self_peer() -> str:
    """This worker's "host:port"."""
    _state.ensure_current()
    return _state.self_peer


def add_apply_listener(listener: Callable[[Change], None], first: bool = False) -> Callable[[], None]:
    """Calls ``listener(change)`` after each version this worker applies and stays in; returns a remover.

    Listeners run in the order added; ``first`` puts this one before those
    added so far (a policy runner's batch follows the size before the
    elastic state syncs).
    """
    with _state.lock:
        if first:
            _state.listeners.insert(0, listener)
        else:
            _state.listeners.append(listener)

    def remove() -> None:
        with _state.lock, contextlib.suppress(ValueError):
            _state.listeners.remove(listener)

    return remove


@contextlib.contextmanager
def resizing(own_commit: int) -> Iterator[None]:
    """While inside, cluster version ``own_commit`` (the one this resize commits) is not a crash.

    Only that version: a later one that drops members (a crash during the
    resize's state sync) still interrupts this worker at once.
    """
    with _state.lock:
        _state.own_commit = own_commit
    try:
        yield
    finally:
        with _state.lock:
            _state.own_commit = 0
        if _state.watcher is not None:
            _state.watcher.recheck()


# ------------------------------------------------------------------ watcher


class _Watcher:
    """Follows the job state (run/control/job_watcher.py's long poll); interrupts the runtime on a crash."""

    def __init__(self, address: str) -> None:
        from kungfu_tf.run.control.config_server import ConfigClient
        from kungfu_tf.run.control.job_watcher import JobWatcher

        # A client of its own: its long polls must not wait behind short calls.
        self._client = ConfigClient(
            address, secret=os.environ.get(SECRET_ENV, ""), job_id=os.environ.get(JOB_ID_ENV, "")
        )
        self._interrupted_version: int | None = None
        self._watcher = JobWatcher(
            self._client,
            on_change=self.recheck,
            poll_timeout=LONG_POLL_SECONDS,
            unreachable_timeout=timeout_seconds(),
        )

    def newest(self):
        """The newest JobState seen (no RPC)."""
        return self._watcher.latest()

    def wait_for(self, predicate: Callable[[config_pb2.JobState], bool], timeout: float | None):
        """The first JobState for which ``predicate(state)`` holds, or None after ``timeout`` seconds (None: no limit).

        Raises:
            JobWatcherError: the config service refused the watcher or stayed unreachable.
        """
        try:
            return self._watcher.wait_for(predicate, None if timeout is None else max(timeout, 0.0))
        except TimeoutError:
            return None

    def recheck(self, state=None) -> None:
        """Interrupts the runtime if a newer committed version stops this worker's (see :func:`stop_reason`)."""
        if state is None:
            state = self.newest()

        def applied_version() -> int | None:  # None: nothing to judge (call under the lock)
            version, peers, me = _state.version, _state.peers, _state.self_peer
            if version is None or version < 1 or me not in peers or state.cluster.version == _state.own_commit:
                return None  # not a member yet (a joiner), or the version our own resize commits
            if state.cluster.version <= version or self._interrupted_version == version:
                return None
            return version

        with _state.lock:
            version = applied_version()
        if version is None:
            return
        # The versions in between are asked outside the lock (apply_version
        # holds it across update_cluster); committed versions never change.
        try:
            for v in range(version + 1, int(state.cluster.version)):
                committed_peers(v, self._client)
        except Exception as e:  # noqa: BLE001 - the service going away: the long poll reports it
            log.warning("kungfu elastic: cannot read the versions after %d: %s", version, e)
            return
        with _state.lock:
            version = applied_version()
            if version is None:
                return
            reason = stop_reason(version, _state.peers, state, lambda v: committed_peers(v, self._client))
            if reason is None:
                return  # joiners admitted: applied at the next check, no step is stopped
            self._interrupted_version = version
            log.info("kungfu elastic: interrupting version %d: %s", version, reason)
            # Under the lock, which apply_version holds across update_cluster:
            # the interrupt meant for this version can never hit the next one.
            _membership().interrupt(reason)

    def stop(self) -> None:
        self._watcher.stop()
        self._client.close()


_committed_cache: dict[int, tuple[str, ...]] = {}


def committed_peers(version: int, client=None) -> tuple[str, ...]:
    """The peers of committed cluster ``version``, asked once (a committed version never changes)."""
    with _state.lock:
        cached = _committed_cache.get(version)
    if cached is None:
        cached = peers_of((client or config_client()).get_cluster_at(version))
        with _state.lock:
            _committed_cache[version] = cached
    return cached


def stop_reason(version: int, peers: Sequence[str], newest, peers_at: Callable[[int], Sequence[str]]) -> str | None:
    """Why the members still in ``version`` (``peers``) must stop their step, now that ``newest`` is committed; None: they need not.

    They must when a newer version dropped one of them (a crash), or when
    any version after theirs restarted its predecessor (the same members
    again, see :func:`restart_version`): someone's collective failed although
    nobody was lost, and members still waiting in an older version's
    collective would otherwise wait for it until the timeout. Versions that
    only admitted joiners stop nobody (applied at the next check).
    ``peers_at(v)``: the peers of committed version v (v < newest).

    Example::

        stop_reason(3, ("a", "b"), state_v5, cluster_at)  # v4 = a,b,c and v5 = a,b,c: a restart of v4
    """
    peers = tuple(peers)
    newest_version = int(newest.cluster.version)
    newest_peers = peers_of(newest.cluster)
    gone = [p for p in peers if p not in newest_peers]
    if gone:
        return (
            f"cluster version {newest_version} was committed without "
            f"{', '.join(gone)}, members of version {version} that this worker uses"
        )
    if newest_peers == peers:
        return f"cluster version {version} was restarted as version {newest_version}"
    previous = peers
    for v in range(version + 1, newest_version + 1):
        committed = newest_peers if v == newest_version else tuple(peers_at(v))
        if committed == previous:
            return f"cluster version {v - 1} was restarted as version {v}"
        previous = committed
    return None


def watcher() -> _Watcher:
    """The running watcher (started on first use)."""
    address = _require_elastic("the membership watcher")
    _state.ensure_current()
    with _state.lock:
        if _state.watcher is None:
            _state.watcher = _Watcher(address)
            atexit.register(_state.watcher.stop)
        return _state.watcher


def job_state():
    """The newest JobState the watcher has seen (no RPC)."""
    return watcher().newest()


def newest_seen() -> int:
    """The newest committed cluster version this worker's watcher has seen."""
    return int(watcher().newest().cluster.version)


def wait_newer_than(version: int, timeout: float):
    """The first JobState whose cluster version > ``version``, or None after ``timeout`` seconds."""
    return watcher().wait_for(lambda s: s.cluster.version > version, timeout)


# ------------------------------------------------------------------ applying


def apply_version(version: int, peers: Sequence[str], *, notify: bool = True) -> Change:
    """Applies committed cluster ``version`` with ``peers`` (rank order) on this worker.

    A member swaps its runtime to it (``update_cluster``) and then runs the
    apply listeners (state sync); a worker not in ``peers`` leaves the job
    (``leave_cluster``). Every member must apply the same versions in the same
    order; :func:`adopt_next` and :mod:`kungfu_tf.ops.resize` make sure of it.
    """
    _state.ensure_current()
    peers = tuple(peers)
    # One critical section with the watcher's interrupt (see _Watcher.recheck):
    # it decides on the version recorded here, so it must not interrupt
    # between the runtime's swap and the record of it.
    with _state.lock:
        old_version, old_peers, me = _state.version, _state.peers, _state.self_peer
        change = Change(old_version, version, old_peers, peers, me)  # type: ignore[arg-type]
        if change.detached:
            log.info("kungfu elastic: leaving the job at cluster version %d", version)
            _membership().leave_cluster()
        else:
            _membership().update_cluster(list(peers), version)
        _state.version, _state.peers = version, peers
        if not change.detached:
            _state.joined = True
        listeners = list(_state.listeners)
    if change.detached:
        _yield_cpu_to_members()
    if _state.watcher is not None:
        _state.watcher.recheck()  # a later version may already have dropped one of the new peers
    if not change.detached:
        _agree_wait_target(version)
    if notify and not change.detached:
        for listener in listeners:
            listener(change)
    return change


def _yield_cpu_to_members() -> None:
    """Lowers this detached worker's CPU priority by ``KUNGFU_DETACHED_NICE`` (default 19; 0: not at all).

    A detached worker only tears down from here on (Python's and
    TensorFlow's exit: tens of milliseconds of CPU). On a host it shares with
    members — several workers per host, or all of them on one — that work
    otherwise lands on the members' first steps at the new size:
    ``make bench-elastic`` measured the first step after a shrink of the
    8.5 M model at about twice the normal step, and the shrink's idle at
    0.055-0.074 s (4 -> 1) with the leavers exiting at once against
    0.028-0.036 s with their exit held back (docs/guide/benchmarks.md).
    """
    from kungfu_tf.run.worker_env.worker_env import read_detached_nice

    try:
        nice = read_detached_nice(os.environ)  # checked at start-up: only a value changed since fails here
    except ValueError as e:
        log.warning("kungfu elastic: the detached worker keeps its priority: %s", e)
        return
    if not nice or not hasattr(os, "setpriority"):
        return
    # Linux keeps a niceness per thread, and this may run on one of TensorFlow's (resize in a
    # tf.function): every thread of the process is lowered, and threads started later inherit it.
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]  # no /proc: the calling thread (the whole process where the OS keeps one value)
    for tid in threads:
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except OSError as e:
            log.warning("kungfu elastic: could not lower the detached worker's priority (%s): %s", nice, e)
            return


def first_version_with(peer: str, newest) -> int:
    """The first committed version (up to ``newest``, a JobState listing ``peer``) that admitted ``peer``.

    A joiner applies that one: the members apply versions in order, one at a time.
    """
    version = int(newest.cluster.version)
    while version > 1 and peer in cluster_at(version - 1):
        version -= 1
    return version


def enter_admitted(newest) -> Change:
    """A joiner that ``newest`` (a JobState) lists as a member: applies the version that admitted it and,
    if the members are inside ``resize(n, wait=True)``, waits with them (the same collectives)."""
    me = self_peer()
    version = first_version_with(me, newest)
    change = apply_version(version, cluster_at(version))
    target = pending_wait()
    if target:
        log.info("kungfu elastic: the members wait for %d workers; waiting with them", target)
        wait_for_size(target, timeout_seconds())
    return change


def _agree_wait_target(version: int) -> None:
    """The members of ``version`` agree (all_reduce(max) on STAR) on the size a resize(wait=True) waits for.

    Members inside ``resize(n, wait=True)`` contribute ``n``, everyone else 0
    (a resize is collective: all old members are inside it or none is). A
    joiner admitted while the members wait learns ``n`` here and, after its
    sync, runs the same wait loop (:func:`wait_for_size`): otherwise it would
    start training while the members run the wait loop's collectives, and
    both would wait for each other until the timeout.
    """
    mine = np.array([_state.wait_target], dtype=np.int64)
    agreed = int(all_reduce(tf.constant(mine), op="max", name=f"kungfu/elastic/wait/{version}", topology="STAR").numpy()[0])
    with _state.lock:
        _state.pending_wait = agreed if _state.wait_target == 0 else 0


def pending_wait() -> int:
    """The size the members wait for (``resize(n, wait=True)``) as learned by the last applied version; 0: none."""
    return _state.pending_wait


def wait_for_size(n: int, timeout: float) -> bool:
    """Applies committed versions in order until the cluster has ``n`` workers; whether any was applied.

    Every member calls it together (``resize(n, wait=True)``; a joiner
    admitted meanwhile joins in, see :func:`pending_wait`): each waits
    locally until it has seen a newer version, then all agree on the newest
    every member has seen and apply the next one (:func:`adopt_next`).

    Raises:
        TimeoutError: the cluster did not reach ``n`` workers within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    changed = False
    with _state.lock:
        _state.wait_target, _state.pending_wait = n, 0
    try:
        while len(current()[1]) != n:
            version, _ = current()
            wait_newer_than(version, max(deadline - time.monotonic(), 0.0))
            # One all-reduce(min) decides both, so that every member (and a
            # joiner waiting with them) applies the same versions and gives up
            # at the same iteration, whoever's clock ran out first.
            mine = np.array([newest_seen(), 0 if time.monotonic() > deadline else 1], dtype=np.int64)
            seen, in_time = (int(v) for v in all_reduce(
                tf.constant(mine), op="min", name=WAIT_SEEN_KEY, topology="STAR").numpy())
            if seen > version:
                apply_version(version + 1, cluster_at(version + 1))
                changed = True
                continue
            if not in_time:
                raise TimeoutError(
                    f"resize(wait=True): the cluster did not reach {n} workers within {timeout:g} s "
                    f"(it has {len(current()[1])}; joiners must warm up and report ready)"
                )
    finally:
        with _state.lock:
            _state.wait_target = 0
    return changed


def lost_peers() -> list[str]:
    """Members of the current version this worker's runtime lost without a goodbye."""
    return list(_membership().lost_peers())


def restart_version(version: int, peers: Sequence[str]) -> None:
    """Commits the same members as version + 1 (compare-and-swap; a no-op if another version came first).

    For a failure that lost no peer (a broken connection, say): the members
    stuck in a collective of ``version`` are interrupted by their watchers
    (a restart version stops steps like a crash does), and all apply the new
    version and sync, as after a crash.
    """
    import grpc

    from kungfu_tf.run.control.config_server import make_cluster
    from kungfu_tf.run.control.peer_string import parse_peer_string

    client = config_client()
    target = int(client.get_job_state().target_size)
    try:
        client.put_cluster(make_cluster(version + 1, [parse_peer_string(p) for p in peers]))
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.FAILED_PRECONDITION:  # someone else's version came first: fine
            raise
        return
    if target != len(peers):
        # PutCluster set the target to the restarted size: keep a growth
        # (or crash replacement) that was under way.
        client.request_size(target)


# How often stop_members_of restarts the newest version when others keep committing first.
STOP_ATTEMPTS = 5


def stop_members_of(version: int, peers: Sequence[str]) -> bool:
    """Makes sure the members still in ``version`` stop their step; whether the newest version does.

    For a worker whose collective of ``version`` failed although nobody was
    lost, when it finds newer versions: if they only admitted joiners (an
    admission window of 0 commits one version per joiner, back to back),
    the members that saw no failure wait in that collective for this worker
    until the timeout, and this worker waits for them in the next one. A
    restart of the newest version (the same members again) stops them all
    (their watchers, :func:`stop_reason`), and all reach it in order.
    """
    client = config_client()
    for _ in range(STOP_ATTEMPTS):
        state = client.get_job_state()
        if stop_reason(version, peers, state, committed_peers) is not None:
            return True
        newest = int(state.cluster.version)
        log.warning(
            "kungfu elastic: version %d failed without a lost peer and versions up to %d only admitted joiners: "
            "restarting version %d so that the members still in version %d stop",
            version, newest, newest, version,
        )
        restart_version(newest, peers_of(state.cluster))
    return False


def cluster_at(version: int) -> tuple[str, ...]:
    """The peers of committed cluster ``version``."""
    return peers_of(config_client().get_cluster_at(version))


def agreed_newest(name: str = SEEN_KEY) -> int:
    """The newest committed version every member has seen: all_reduce(min) on STAR.

    Every member of the current cluster must call it at the same point.
    """
    seen = np.array([newest_seen()], dtype=np.int64)
    return int(all_reduce(tf.constant(seen), op="min", name=name, topology="STAR").numpy()[0])


def adopt_next(name: str = SEEN_KEY) -> Change | None:
    """Applies the next committed version if every member has seen it; None if there is none.

    Every member calls it at the same point (a step boundary), gets the same
    answer and applies the same version (current + 1: one at a time, so that
    joiners admitted in different versions meet the members where they are).
    """
    version, _ = current()
    if agreed_newest(name) <= version:
        return None
    return apply_version(version + 1, cluster_at(version + 1))
