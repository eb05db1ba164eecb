"""The job's membership and elastic state, as the config service keeps it (no gRPC).

One :class:`JobStateMachine` lives inside each ConfigServer
(kungfu_tf/run/config_server.py, which only translates gRPC calls to the
methods below and :class:`JobStateError` to status codes). It holds:

* the committed Cluster versions (every one is kept: GetClusterAt);
* for elastic jobs, a ``JobState`` (proto/config.proto): target size,
  min/max, the model signature, joiners (STARTING / READY / REJECTED) and
  ``state_version``, which advances on every change so launchers and workers
  can long-poll it (:meth:`JobStateMachine.wait`).

Rules (see /work/wt/notes/elastic_spec.md and proto/config.proto):

* ``put_cluster`` is a compare-and-swap: the new version must be the current
  one + 1. In an elastic job it also sets ``target_size`` to the new size and
  refuses sizes outside [min_size, max_size] (OUT_OF_RANGE).
* READY joiners whose signature equals the job's are admitted in the order
  they became ready, while the cluster is smaller than ``target_size``: one
  new version appends all joiners admitted at once. A joiner with another
  signature is REJECTED with a reason naming the first differing line (that
  is, the first variable: one line "name shape dtype" per variable).
* ``report_lost(v, peers)``: if the cluster is still at v, commits v + 1
  without ``peers`` (survivors keep their order); the first report about v
  wins, later ones are answered with the current state. ``target_size`` is
  lowered by the number lost unless crashed workers are replaced.

Example:
    >>> from kungfu_tf.run.job_state import JobStateMachine
    >>> from kungfu_tf.run.peer_string import parse_peer_string as p
    >>> from kungfu_tf.proto import config_pb2
    >>> initial = config_pb2.Cluster(version=1, workers=[p("h:1"), p("h:2")])
    >>> jobs = JobStateMachine(initial, elastic=True, max_size=4)
    >>> _ = jobs.set_signature("w (2, 2) float32")
    >>> _ = jobs.request_size(3)
    >>> _ = jobs.add_joiner(p("h:3"))
    >>> state = jobs.joiner_ready(p("h:3"), "w (2, 2) float32")
    >>> state.cluster.version, len(state.cluster.workers), len(state.joiners)
    (2, 3, 0)
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.peer_string import peer_problem, peer_string

__all__ = [
    "MAX_WAIT_SECONDS",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "JobStateError",
    "JobStateMachine",
    "NotFoundError",
    "OutOfRangeError",
    "cluster_problem",
    "signature_difference",
]

# A long poll answers after at most this long (the caller polls again), so a
# server never holds a call, and its thread, for longer.
MAX_WAIT_SECONDS = 60.0

Joiner = config_pb2.Joiner


class JobStateError(Exception):
    """A refused request. ``code`` names the gRPC status the service answers with."""

    code = "UNKNOWN"


class InvalidArgumentError(JobStateError, ValueError):
    """The request itself is malformed or names something that cannot be."""

    code = "INVALID_ARGUMENT"


class FailedPreconditionError(JobStateError):
    """The request is well-formed but the job's state does not allow it now."""

    code = "FAILED_PRECONDITION"


class OutOfRangeError(JobStateError, ValueError):
    """A size outside the job's [min_size, max_size]."""

    code = "OUT_OF_RANGE"


class NotFoundError(JobStateError, LookupError):
    """A cluster version or joiner the service does not know."""

    code = "NOT_FOUND"


class AlreadyExistsError(JobStateError):
    """A joiner announced at an address that is already a member or a joiner."""

    code = "ALREADY_EXISTS"


def cluster_problem(cluster: config_pb2.Cluster) -> str | None:
    """Why ``cluster`` is malformed (bad or duplicate workers), or None if it is fine."""
    seen = set()
    for rank, w in enumerate(cluster.workers):
        problem = peer_problem(w)
        if problem is not None:
            return f"workers[{rank}] {problem}"
        if (w.host, w.port) in seen:
            return f"workers[{rank}] {peer_string(w)} appears more than once"
        seen.add((w.host, w.port))
    return None


def signature_difference(expected: str, got: str, *, got_name: str = "the joiner") -> str | None:
    """Where the model signature ``got`` first differs from ``expected``, or None if equal.

    Signatures are compared line by line (one line "name shape dtype" per
    variable), so the answer names the first variable that differs.

    Example:
        >>> signature_difference("a (2,) float32\\nb (3,) float32", "a (2,) float32\\nb (4,) float32")
        "line 2: the job has 'b (3,) float32', the joiner has 'b (4,) float32'"
    """
    want, have = expected.splitlines(), got.splitlines()
    for line, (a, b) in enumerate(zip(want, have), start=1):
        if a != b:
            return f"line {line}: the job has {a!r}, {got_name} has {b!r}"
    if len(want) > len(have):
        return (
            f"line {len(have) + 1}: the job has {want[len(have)]!r}, {got_name} has no such line "
            f"({len(have)} lines against the job's {len(want)})"
        )
    if len(have) > len(want):
        return (
            f"line {len(want) + 1}: {got_name} has {have[len(want)]!r}, the job has no such line "
            f"({len(want)} lines against {len(have)})"
        )
    return None


def _key(peer: config_pb2.PeerID) -> tuple[str, int]:
    return (peer.host, peer.port)


@dataclass
class _Joiner:
    peer: config_pb2.PeerID
    state: int = Joiner.STARTING
    signature: str = ""
    reason: str = ""
    ready_order: int = 0  # position in the order joiners became READY


class JobStateMachine:
    """Thread-safe state of one job's membership (all methods may be called concurrently).

    Args:
      initial: the starting Cluster (default: version 0, no workers). It is
        the first entry of the history.
      elastic: allow the elastic requests (request_size, report_lost,
        joiners, signatures); without it they fail with FailedPreconditionError.
      min_size, max_size: bounds on target_size and on the sizes put_cluster
        may commit (max_size 0 = no upper bound).
      replace_crashed: report_lost keeps target_size, so launchers start
        replacements (joiners) for crashed workers.

    Every method that changes something returns the new ``JobState``; errors
    are :class:`JobStateError` subclasses with a message naming the cause.
    """

    def __init__(
        self,
        initial: config_pb2.Cluster | None = None,
        *,
        elastic: bool = False,
        min_size: int = 1,
        max_size: int = 0,
        replace_crashed: bool = False,
    ):
        initial = initial if initial is not None else config_pb2.Cluster()
        problem = cluster_problem(initial)
        if problem is not None:
            raise ValueError(f"initial cluster: {problem}")
        for name, value in (("min_size", min_size), ("max_size", max_size)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**32 - 1:
                raise ValueError(f"{name} must be an integer in 0..2**32-1, got {value!r}")
        if min_size < 1:
            raise ValueError(f"min_size must be at least 1, got {min_size}")
        if max_size and max_size < min_size:
            raise ValueError(f"max_size ({max_size}) must be 0 (no limit) or >= min_size ({min_size})")
        size = len(initial.workers)
        if elastic and size and not self._size_fits(size, min_size, max_size):
            raise ValueError(
                f"initial cluster has {size} workers, outside [min_size={min_size}, max_size={max_size or 'no limit'}]"
            )
        self._elastic = elastic
        self._min = min_size
        self._max = max_size
        self._replace_crashed = replace_crashed
        self._cond = threading.Condition()
        self._cluster = config_pb2.Cluster()
        self._cluster.CopyFrom(initial)
        self._history: dict[int, config_pb2.Cluster] = {initial.version: self._copy(initial)}
        self._reasons: dict[int, str] = {initial.version: "initial cluster"}
        self._target = size
        self._signature = ""
        self._joiners: dict[tuple[str, int], _Joiner] = {}  # in the order they were added
        self._ready_count = 0
        # Starts at 1, so a first wait(after_state_version=0) answers at once.
        self._state_version = 1
        # release_waiters() bumps it; a wait that sees it change returns at once.
        self._release_generation = 0

    # ------------------------------------------------------------------ reads

    @property
    def elastic(self) -> bool:
        return self._elastic

    def cluster(self) -> config_pb2.Cluster:
        """The current Cluster (a copy)."""
        with self._cond:
            return self._copy(self._cluster)

    def job_state(self) -> config_pb2.JobState:
        """The whole JobState (a copy)."""
        with self._cond:
            return self._snapshot()

    def cluster_at(self, version: int) -> config_pb2.Cluster:
        """The Cluster committed as ``version``; NotFoundError if it never was."""
        with self._cond:
            cluster = self._history.get(version)
            if cluster is None:
                first = min(self._history)
                raise NotFoundError(
                    f"cluster version {version} was never committed "
                    f"(known versions: {first}..{self._cluster.version})"
                )
            return self._copy(cluster)

    def commit_reason(self, version: int) -> str:
        """Why ``version`` was committed ("lost h:2: killed by SIGKILL", "admitted h:5", ...)."""
        with self._cond:
            if version not in self._reasons:
                raise NotFoundError(f"cluster version {version} was never committed")
            return self._reasons[version]

    def wait(
        self,
        after_state_version: int,
        timeout: float,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> config_pb2.JobState:
        """The JobState as soon as its state_version > ``after_state_version``.

        Returns the current state after ``timeout`` seconds (capped at
        MAX_WAIT_SECONDS) if nothing changed, when :meth:`release_waiters` is
        called (server stop), or when ``cancelled()`` turns true (checked
        whenever :meth:`wake` is called: the gRPC glue wakes the waiters when
        a call is cancelled).
        """
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or math.isnan(timeout) or timeout < 0:
            raise InvalidArgumentError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        deadline = time.monotonic() + min(timeout, MAX_WAIT_SECONDS)
        with self._cond:
            if after_state_version > self._state_version:
                raise InvalidArgumentError(
                    f"after_state_version {after_state_version} is ahead of the job's "
                    f"state_version {self._state_version} (a state from another server?)"
                )
            generation = self._release_generation
            while self._state_version <= after_state_version and generation == self._release_generation:
                if cancelled is not None and cancelled():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return self._snapshot()

    def wake(self) -> None:
        """Makes every waiter re-check its condition (e.g. after a cancelled call)."""
        with self._cond:
            self._cond.notify_all()

    def release_waiters(self) -> None:
        """Makes every wait in progress return the current state now (server stop)."""
        with self._cond:
            self._release_generation += 1
            self._cond.notify_all()

    # --------------------------------------------------------------- changes

    def put_cluster(self, cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        """Commits ``cluster`` if its version is the current one + 1 (compare-and-swap).

        Raises:
            InvalidArgumentError: malformed workers (empty host, bad port, duplicates).
            FailedPreconditionError: version conflict (re-read and decide again).
            OutOfRangeError: elastic job, size outside [min_size, max_size].
        """
        problem = cluster_problem(cluster)
        if problem is not None:
            raise InvalidArgumentError(problem)
        with self._cond:
            current = self._cluster.version
            if cluster.version != current + 1:
                raise FailedPreconditionError(
                    f"version conflict: the cluster is at version {current}, "
                    f"so the new cluster must have version {current + 1}, "
                    f"got {cluster.version}; re-read it with GetCluster and retry"
                )
            size = len(cluster.workers)
            if self._elastic and not self._size_fits(size, self._min, self._max):
                raise OutOfRangeError(
                    f"the new cluster has {size} workers, {self._range_text()}; nothing changed"
                )
            self._commit(list(cluster.workers), "put_cluster")
            if self._elastic:
                self._target = size
            self._changed()
            return self._copy(self._cluster)

    def request_size(self, size: int) -> config_pb2.JobState:
        """Sets target_size (growing: launchers start joiners; READY ones may be admitted now)."""
        self._require_elastic("RequestSize")
        with self._cond:
            if not self._size_fits(size, self._min, self._max):
                raise OutOfRangeError(f"requested size {size} is {self._range_text()}")
            if size != self._target:
                self._target = size
                self._admit()
                self._changed()
            return self._snapshot()

    def report_lost(
        self, version: int, peers: Sequence[config_pb2.PeerID], reason: str = ""
    ) -> config_pb2.JobState:
        """Members of cluster ``version`` crashed: commits version + 1 without them.

        Only the first report about the current version commits; a report
        about an older version is answered with the current state.

        Raises:
            InvalidArgumentError: no peers, a malformed peer, a version that
                was never committed, or a peer that was not a member of it.
        """
        self._require_elastic("ReportLost")
        if not peers:
            raise InvalidArgumentError("no peers named as lost")
        for i, peer in enumerate(peers):
            problem = peer_problem(peer)
            if problem is not None:
                raise InvalidArgumentError(f"peers[{i}] {problem}")
        with self._cond:
            reported = self._history.get(version)
            if reported is None:
                raise InvalidArgumentError(
                    f"reported version {version} was never committed (the cluster is at version "
                    f"{self._cluster.version})"
                )
            members = {_key(w) for w in reported.workers}
            for peer in peers:
                if _key(peer) not in members:
                    raise InvalidArgumentError(
                        f"{peer_string(peer)} is not a member of cluster version {version} "
                        f"({', '.join(peer_string(w) for w in reported.workers) or 'no workers'})"
                    )
            if version != self._cluster.version:
                return self._snapshot()  # an earlier report about `version` already committed
            lost = {_key(p) for p in peers}
            survivors = [w for w in self._cluster.workers if _key(w) not in lost]
            names = ", ".join(peer_string(w) for w in self._cluster.workers if _key(w) in lost)
            self._commit(survivors, f"lost {names}" + (f": {reason}" if reason else ""))
            if not self._replace_crashed:
                self._target = self._clamp(self._target - len(lost))
            self._admit()
            self._changed()
            return self._snapshot()

    def add_joiner(self, peer: config_pb2.PeerID) -> config_pb2.JobState:
        """A launcher started a joiner at ``peer`` (STARTING). Repeating it is a no-op.

        Raises:
            AlreadyExistsError: ``peer`` is a member, or a joiner past STARTING.
        """
        self._require_elastic("AddJoiner")
        self._check_peer(peer)
        with self._cond:
            key = _key(peer)
            if any(_key(w) == key for w in self._cluster.workers):
                raise AlreadyExistsError(
                    f"{peer_string(peer)} is already a member of cluster version {self._cluster.version}"
                )
            joiner = self._joiners.get(key)
            if joiner is not None:
                if joiner.state == Joiner.STARTING:
                    return self._snapshot()
                raise AlreadyExistsError(
                    f"joiner {peer_string(peer)} is already {Joiner.State.Name(joiner.state)}; "
                    "RemoveJoiner it before starting another at that address"
                )
            self._joiners[key] = _Joiner(peer=self._copy_peer(peer))
            self._changed()
            return self._snapshot()

    def joiner_ready(self, peer: config_pb2.PeerID, signature: str) -> config_pb2.JobState:
        """A joiner is warm: READY (or REJECTED if ``signature`` differs from the job's).

        May admit it (and other READY joiners) at once. A joiner not announced
        with add_joiner is accepted (its launcher may be slower than it); one
        that is already a member gets the current state (a retried call).
        """
        self._require_elastic("JoinerReady")
        self._check_peer(peer)
        self._check_signature(signature)
        with self._cond:
            key = _key(peer)
            if any(_key(w) == key for w in self._cluster.workers):
                return self._snapshot()
            joiner = self._joiners.get(key)
            if joiner is None:
                joiner = self._joiners[key] = _Joiner(peer=self._copy_peer(peer))
            elif joiner.state != Joiner.STARTING:
                if joiner.state == Joiner.READY and joiner.signature == signature:
                    return self._snapshot()  # a retried call
                raise FailedPreconditionError(
                    f"joiner {peer_string(peer)} is already {Joiner.State.Name(joiner.state)}"
                    + (f": {joiner.reason}" if joiner.reason else "")
                )
            joiner.signature = signature
            self._ready_count += 1
            joiner.ready_order = self._ready_count
            joiner.state = Joiner.READY
            if self._signature:
                self._judge(joiner)
            self._admit()
            self._changed()
            return self._snapshot()

    def set_signature(self, signature: str) -> config_pb2.JobState:
        """Members' model signature: the first call sets the job's; later ones must equal it.

        Setting it judges the joiners that were already READY.

        Raises:
            FailedPreconditionError: ``signature`` differs from the job's (the
                message names the first differing line).
        """
        self._require_elastic("SetSignature")
        self._check_signature(signature)
        with self._cond:
            if self._signature:
                difference = signature_difference(self._signature, signature, got_name="this member")
                if difference is not None:
                    raise FailedPreconditionError(f"the model signature differs from the job's at {difference}")
                return self._snapshot()
            self._signature = signature
            for joiner in self._joiners.values():
                if joiner.state == Joiner.READY:
                    self._judge(joiner)
            self._admit()
            self._changed()
            return self._snapshot()

    def remove_joiner(self, peer: config_pb2.PeerID) -> config_pb2.JobState:
        """Forgets a joiner (any state) whose process exited or was stopped.

        Raises:
            NotFoundError: ``peer`` is not a joiner (e.g. it was admitted: a
                member that is gone is reported with report_lost).
        """
        self._require_elastic("RemoveJoiner")
        self._check_peer(peer)
        with self._cond:
            if self._joiners.pop(_key(peer), None) is None:
                member = any(_key(w) == _key(peer) for w in self._cluster.workers)
                raise NotFoundError(
                    f"{peer_string(peer)} is not a joiner"
                    + (
                        f"; it is a member of cluster version {self._cluster.version} (use ReportLost)"
                        if member
                        else ""
                    )
                )
            self._changed()
            return self._snapshot()

    # ------------------------------------------------------------- internals

    @staticmethod
    def _size_fits(size: int, min_size: int, max_size: int) -> bool:
        return isinstance(size, int) and min_size <= size and (not max_size or size <= max_size)

    def _range_text(self) -> str:
        upper = f"max_size={self._max}" if self._max else "no max_size"
        return f"outside [min_size={self._min}, {upper}] (kungfu-run --min-np/--max-np)"

    def _clamp(self, size: int) -> int:
        size = max(size, self._min)
        return min(size, self._max) if self._max else size

    def _require_elastic(self, method: str) -> None:
        if not self._elastic:
            raise FailedPreconditionError(
                f"{method} needs an elastic job (kungfu-run --elastic; ConfigServer(elastic=True))"
            )

    @staticmethod
    def _check_peer(peer: config_pb2.PeerID) -> None:
        problem = peer_problem(peer)
        if problem is not None:
            raise InvalidArgumentError(f"peer {problem}")

    @staticmethod
    def _check_signature(signature: str) -> None:
        if not signature.strip():
            raise InvalidArgumentError("empty model signature (want one line 'name shape dtype' per variable)")

    def _judge(self, joiner: _Joiner) -> None:
        """REJECTs a READY joiner whose signature differs from the job's (lock held)."""
        difference = signature_difference(self._signature, joiner.signature)
        if difference is not None:
            joiner.state = Joiner.REJECTED
            joiner.reason = f"joiner {peer_string(joiner.peer)} has a different model: {difference}"

    def _admit(self) -> None:
        """Admits READY joiners in ready order while size < target (lock held): one commit."""
        if not self._signature:
            return  # READY joiners wait until a member has set the job's signature
        room = self._target - len(self._cluster.workers)
        ready = sorted(
            (j for j in self._joiners.values() if j.state == Joiner.READY), key=lambda j: j.ready_order
        )[: max(room, 0)]
        if not ready:
            return
        self._commit(
            list(self._cluster.workers) + [j.peer for j in ready],
            "admitted " + ", ".join(peer_string(j.peer) for j in ready),
        )

    def _commit(self, workers: Iterable[config_pb2.PeerID], reason: str) -> None:
        """Commits the next version with ``workers`` (lock held); admitted joiners are dropped."""
        cluster = config_pb2.Cluster(version=self._cluster.version + 1)
        for w in workers:
            cluster.workers.add().CopyFrom(w)
            self._joiners.pop(_key(w), None)
        self._cluster = cluster
        self._history[cluster.version] = self._copy(cluster)
        self._reasons[cluster.version] = reason

    def _changed(self) -> None:
        self._state_version += 1
        self._cond.notify_all()

    def _snapshot(self) -> config_pb2.JobState:
        state = config_pb2.JobState(
            target_size=self._target,
            min_size=self._min,
            max_size=self._max,
            signature=self._signature,
            state_version=self._state_version,
        )
        state.cluster.CopyFrom(self._cluster)
        for j in self._joiners.values():
            state.joiners.add(peer=j.peer, state=j.state, signature=j.signature, reason=j.reason)
        return state

    @staticmethod
    def _copy(cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        out = config_pb2.Cluster()
        out.CopyFrom(cluster)
        return out

    @staticmethod
    def _copy_peer(peer: config_pb2.PeerID) -> config_pb2.PeerID:
        return config_pb2.PeerID(host=peer.host, port=peer.port)
