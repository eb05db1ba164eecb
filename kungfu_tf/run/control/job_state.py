"""The job's membership and elastic state, as the config service keeps it (no gRPC).

One :class:`JobStateMachine` lives inside each ConfigServer
(kungfu_tf/run/control/config_server.py, which only translates gRPC calls to the
methods below and :class:`JobStateError` to status codes). It holds:

* the committed Cluster versions (every one is kept: GetClusterAt);
* for elastic jobs, a ``JobState`` (proto/config.proto): target size,
  min/max, the model signature, joiners (STARTING / READY / REJECTED), the
  members that finished, and ``state_version``, which advances on every change so launchers and workers
  can long-poll it (:meth:`JobStateMachine.wait`).

Rules (see /work/wt/notes/elastic_spec.md and proto/config.proto):

* ``put_cluster`` is a compare-and-swap: the new version must be the current
  one + 1. In an elastic job it also sets ``target_size`` to the new size and
  refuses sizes outside [min_size, max_size] (OUT_OF_RANGE).
* READY joiners whose signature equals the job's are admitted in the order
  they became ready, while the cluster is smaller than ``target_size``: one
  new version appends all joiners admitted at once. With an admission
  window (``admit_window`` seconds > 0), joiners of one growth are admitted
  together: once one is READY and could be admitted, admission waits until
  every joiner that fits under the target (size + READY + STARTING) is
  READY, or until the window, counted from that moment, ends; every version
  change costs the members a state sync, while waiting costs nothing (they
  keep training while joiners warm up). A joiner with another
  signature is REJECTED with a reason naming the first differing line (that
  is, the first variable: one line "name shape dtype" per variable).
* ``report_lost(v, peers)``: if the cluster is still at v, commits v + 1
  without ``peers`` (survivors keep their order); the first report about v
  wins, later ones are answered with the current state. ``target_size`` is
  lowered by the number lost unless crashed workers are replaced.
* ``remove_joiner(peer)`` forgets a joiner; if it was STARTING or READY
  (withdrawn: its launcher stops it), its late JoinerReady is refused until
  ``add_joiner`` announces a joiner at that address again.
* ``report_finished(peer)``: a member's process exited 0. It stays a member
  (listed in ``JobState.finished``) and is never lost: ``report_lost``
  leaves finished members out (naming only finished ones commits nothing),
  because a worker whose training ended may look like a crash to a peer
  that was still talking to it. Once a member finished, joiners are no
  longer admitted (they would wait for members that are gone); the job is
  over when every member has finished (:func:`job_finished`).

Example:
    >>> from kungfu_tf.run.control.job_state import JobStateMachine
    >>> from kungfu_tf.run.control.peer_string import parse_peer_string as p
    >>> from kungfu_tf.proto import config_pb2
    >>> initial = config_pb2.Cluster(version=1, workers=[p("h:1"), p("h:2")])
    >>> jobs = JobStateMachine(initial, elastic=True, max_size=4)
    >>> _ = jobs.set_signature("w (2, 2) float32")
    >>> _ = jobs.request_size(3)
    >>> _ = jobs.add_joiner(p("h:3"))
    >>> state = jobs.joiner_ready(p("h:3"), "w (2, 2) float32")
    >>> state.cluster.version, len(state.cluster.workers), len(state.joiners)
    (2, 3, 0)

With an admission window, the first of two joiners waits for the second
(the config service's timer calls ``admit_due`` when the window ends)::

    >>> clock = [0.0]
    >>> jobs = JobStateMachine(initial, elastic=True, max_size=4, admit_window=5.0, clock=lambda: clock[0])
    >>> _ = jobs.set_signature("w (2, 2) float32")
    >>> _ = jobs.request_size(4)
    >>> _ = jobs.add_joiner(p("h:3")), jobs.add_joiner(p("h:4"))
    >>> jobs.joiner_ready(p("h:3"), "w (2, 2) float32").cluster.version, jobs.admission_deadline()
    (1, 5.0)
    >>> clock[0] = 1.5
    >>> len(jobs.joiner_ready(p("h:4"), "w (2, 2) float32").cluster.workers)
    4
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.peer_string import (
    parse_peer_string,
    peer_problem,
    peer_string,
)

__all__ = [
    "MAX_WAIT_SECONDS",
    "PLAIN_SIGNATURE",
    "AlreadyExistsError",
    "FailedPreconditionError",
    "InvalidArgumentError",
    "JobStateError",
    "JobStateMachine",
    "NotFoundError",
    "OutOfRangeError",
    "cluster_problem",
    "job_finished",
    "signature_difference",
]

# A long poll answers after at most this long (the caller polls again), so a
# server never holds a call, and its thread, for longer.
MAX_WAIT_SECONDS = 60.0

Joiner = config_pb2.Joiner

# The model signature of a job whose workers are plain processes (KungFu's
# elastic scripts: no ElasticState, each script syncs its own variables with
# broadcast_variables after a resize). Members set it when they grow without
# an ElasticState, and their joiners report it: it names no variable, so the
# service admits them without comparing models, and a joiner of the other
# kind (or a member's real signature) differs from it and is refused with
# the reason below.
PLAIN_SIGNATURE = "<plain processes: each script syncs its own state (broadcast_variables)>"


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
    if (expected == PLAIN_SIGNATURE) != (got == PLAIN_SIGNATURE):
        plain, synced = ("the job", got_name) if expected == PLAIN_SIGNATURE else (got_name, "the job")
        return (
            f"line 1: {plain} is made of plain processes that sync their own state (resize without an "
            f"ElasticState, joiners admitted at their first collective), {synced} syncs an ElasticState "
            f"({(got if expected == PLAIN_SIGNATURE else expected).splitlines()[0]!r}); every worker must run "
            "the same kind of script"
        )
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


def extends_signature(old: str, new: str) -> bool:
    """Whether ``new`` holds every line of ``old``, in order, and more (variables created after ``old``).

    Example:
        >>> extends_signature("w (2,) float32", "w (2,) float32\nsgd/w_momentum (2,) float32")
        True
        >>> extends_signature("w (2,) float32", "w (3,) float32\nsgd/w_momentum (3,) float32")
        False
    """
    lines = iter(new.splitlines())
    return len(new.splitlines()) > len(old.splitlines()) and all(line in lines for line in old.splitlines())


def _key(peer: config_pb2.PeerID) -> tuple[str, int]:
    return (peer.host, peer.port)


def job_finished(state: config_pb2.JobState) -> bool:
    """Whether every member of ``state``'s cluster has finished (the job is over).

    Example:
        >>> from kungfu_tf.run.control.peer_string import parse_peer_string as p
        >>> state = config_pb2.JobState(cluster=config_pb2.Cluster(version=1, workers=[p("h:1")]))
        >>> job_finished(state)
        False
        >>> state.finished.append(p("h:1"))
        >>> job_finished(state)
        True
    """
    members = {_key(w) for w in state.cluster.workers}
    return bool(members) and members <= {_key(w) for w in state.finished}


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
      admit_window: seconds a READY joiner may wait for the other joiners
        that fit under the target (still STARTING) to be admitted with them
        in one version; 0 admits each as soon as it is READY. Admission
        happens on requests, so with a window something must call
        :meth:`admit_due` when it ends (:meth:`run_admission_timer` does).
      clock: seconds, monotonic (``time.monotonic``; tests pass a fake one).

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
        admit_window: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
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
        if (
            not isinstance(admit_window, (int, float))
            or isinstance(admit_window, bool)
            or not math.isfinite(admit_window)
            or admit_window < 0
        ):
            raise ValueError(f"admit_window must be a finite number of seconds >= 0, got {admit_window!r}")
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
        self._admit_window = float(admit_window)
        self._clock = clock
        # When (clock) READY joiners first waited for others of their growth;
        # None while no admission is pending.
        self._window_opened: float | None = None
        self._timer_stopped = False
        self._cond = threading.Condition()
        self._cluster = config_pb2.Cluster()
        self._cluster.CopyFrom(initial)
        self._history: dict[int, config_pb2.Cluster] = {initial.version: self._copy(initial)}
        self._reasons: dict[int, str] = {initial.version: "initial cluster"}
        self._target = size
        self._signature = ""
        self._joiners: dict[tuple[str, int], _Joiner] = {}  # in the order they were added
        self._finished: dict[tuple[str, int], config_pb2.PeerID] = {}  # in the order reported
        # Joiners withdrawn with remove_joiner before they were judged (until
        # one is added there again): their late JoinerReady must not bring
        # them back.
        self._removed: set[tuple[str, int]] = set()
        self._ready_count = 0
        # Starts at 1, so a first wait(after_state_version=0) answers at once.
        self._state_version = 1
        # release_waiters() bumps it; a wait that sees it change returns at once.
        self._release_generation = 0
        self._progress = config_pb2.JobProgress()  # rank 0's newest report (report_progress)

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
        about an older version is answered with the current state. Finished
        members are left out (not lost); a report naming only finished
        members commits nothing.

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
            # A finished member ended well; its goodbye is not a crash.
            lost = {_key(p) for p in peers} - self._finished.keys()
            if not lost:
                return self._snapshot()
            survivors = [w for w in self._cluster.workers if _key(w) not in lost]
            names = ", ".join(peer_string(w) for w in self._cluster.workers if _key(w) in lost)
            self._commit(survivors, f"lost {names}" + (f": {reason}" if reason else ""))
            if not self._replace_crashed:
                self._target = self._clamp(self._target - len(lost))
            self._admit()
            self._changed()
            return self._snapshot()

    def report_finished(self, peer: config_pb2.PeerID) -> config_pb2.JobState:
        """A member's process exited 0: it is listed as finished (repeating it is a no-op).

        Raises:
            FailedPreconditionError: ``peer`` is not a member of the current
                cluster (e.g. the version just committed left it out: it
                detached rather than finished).
        """
        self._require_elastic("ReportFinished")
        self._check_peer(peer)
        with self._cond:
            key = _key(peer)
            if not any(_key(w) == key for w in self._cluster.workers):
                raise FailedPreconditionError(
                    f"{peer_string(peer)} is not a member of the current cluster version "
                    f"{self._cluster.version} "
                    f"({', '.join(peer_string(w) for w in self._cluster.workers) or 'no workers'}); "
                    "a worker that exits 0 after it was left out detached, it did not finish"
                )
            if key not in self._finished:
                self._finished[key] = self._copy_peer(peer)
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
            self._removed.discard(key)
            self._changed()
            return self._snapshot()

    def joiner_ready(self, peer: config_pb2.PeerID, signature: str) -> config_pb2.JobState:
        """A joiner is warm: READY (or REJECTED if ``signature`` differs from the job's).

        May admit it (and other READY joiners) at once. A joiner not announced
        with add_joiner is accepted (its launcher may be slower than it); one
        that is already a member gets the current state (a retried call).

        Raises:
            FailedPreconditionError: the joiner was removed (remove_joiner:
                its launcher withdrew it, e.g. after --join-timeout, and is
                stopping it), or it is REJECTED / READY with another signature.
        """
        self._require_elastic("JoinerReady")
        self._check_peer(peer)
        self._check_signature(signature)
        with self._cond:
            key = _key(peer)
            if any(_key(w) == key for w in self._cluster.workers):
                return self._snapshot()
            joiner = self._joiners.get(key)
            if joiner is None and key in self._removed:
                raise FailedPreconditionError(
                    f"joiner {peer_string(peer)} was withdrawn (RemoveJoiner) before it was ready; "
                    "it will not be admitted (AddJoiner announces a new joiner at that address)"
                )
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

    def set_signature(self, signature: str, grow: bool = False) -> config_pb2.JobState:
        """Members' model signature: the first call sets the job's; later ones must equal it.

        Setting it judges the joiners that were already READY. With ``grow``
        (the members' first step created variables, e.g. an optimizer's
        slots), a signature that holds every line of the job's, in order,
        and more replaces it; READY joiners are judged again.

        Raises:
            FailedPreconditionError: ``signature`` differs from the job's (the
                message names the first differing line), and does not extend
                it where ``grow`` was given.
        """
        self._require_elastic("SetSignature")
        self._check_signature(signature)
        with self._cond:
            if self._signature and grow and extends_signature(self._signature, signature):
                self._signature = ""  # set anew below
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

        The late JoinerReady of a joiner removed while STARTING or READY is
        refused (until add_joiner announces a joiner at that address again):
        its launcher withdrew it and is stopping it. After a REJECTED one,
        whose process exits by itself, a new process at the address may join.

        Raises:
            NotFoundError: ``peer`` is not a joiner (e.g. it was admitted: a
                member that is gone is reported with report_lost).
        """
        self._require_elastic("RemoveJoiner")
        self._check_peer(peer)
        with self._cond:
            joiner = self._joiners.pop(_key(peer), None)
            if joiner is None:
                member = any(_key(w) == _key(peer) for w in self._cluster.workers)
                raise NotFoundError(
                    f"{peer_string(peer)} is not a joiner"
                    + (
                        f"; it is a member of cluster version {self._cluster.version} (use ReportLost)"
                        if member
                        else ""
                    )
                )
            if joiner.state != Joiner.REJECTED:
                # Withdrawn while its process may still run (and be stopped).
                self._removed.add(_key(peer))
            # The READY joiners that waited for it may be complete now.
            self._admit()
            self._changed()
            return self._snapshot()

    def report_progress(self, step: int, version: int) -> None:
        """Rank 0 trained to ``step`` at cluster ``version`` (kept for kungfu-run's job status).

        Only the newest report is kept, stamped with this machine's clock. It
        does not advance ``state_version``: no long poll wakes for it, and the
        launchers read it with the next state they fetch.
        """
        self._require_elastic("ReportProgress")
        with self._cond:
            reported_ms = max(1, int(self._clock() * 1000))  # 0 means never reported
            self._progress = config_pb2.JobProgress(step=step, version=version, reported_ms=reported_ms)

    # ------------------------------------------------------------ records

    def to_record(self) -> dict:
        """Everything this machine knows, as JSON-ready data (a store keeps it: job_store.py).

        :meth:`from_record` builds an equal machine from it, so that several
        processes can share one job's state through a store: each loads the
        record, applies one request to the machine, and writes the record
        back with a compare-and-set. The admission window's start is kept
        on this machine's clock (stores use a wall clock: ``time.time``).
        """
        with self._cond:
            return {
                "elastic": self._elastic,
                "min_size": self._min,
                "max_size": self._max,
                "replace_crashed": self._replace_crashed,
                "admit_window": self._admit_window,
                "window_opened": self._window_opened,
                "history": {str(v): [peer_string(w) for w in c.workers] for v, c in self._history.items()},
                "reasons": {str(v): r for v, r in self._reasons.items()},
                "version": self._cluster.version,
                "target": self._target,
                "signature": self._signature,
                "joiners": [
                    [peer_string(j.peer), j.state, j.signature, j.reason, j.ready_order]
                    for j in self._joiners.values()
                ],
                "finished": [peer_string(w) for w in self._finished.values()],
                "removed": sorted(peer_string(config_pb2.PeerID(host=h, port=p)) for h, p in self._removed),
                "ready_count": self._ready_count,
                "state_version": self._state_version,
                "progress": [self._progress.step, self._progress.version, self._progress.reported_ms],
            }

    @classmethod
    def from_record(cls, record: dict, *, clock: Callable[[], float] = time.time) -> JobStateMachine:
        """The machine that :meth:`to_record` described (raises KeyError/ValueError if malformed)."""
        peer = parse_peer_string
        history = {int(v): [peer(w) for w in ws] for v, ws in record["history"].items()}
        version = int(record["version"])
        first = min(history)
        machine = cls(
            config_pb2.Cluster(version=first, workers=history[first]),
            elastic=bool(record["elastic"]),
            min_size=int(record["min_size"]),
            max_size=int(record["max_size"]),
            replace_crashed=bool(record["replace_crashed"]),
            admit_window=float(record["admit_window"]),
            clock=clock,
        )
        machine._history = {v: config_pb2.Cluster(version=v, workers=ws) for v, ws in history.items()}
        machine._reasons = {int(v): str(r) for v, r in record["reasons"].items()}
        machine._cluster = cls._copy(machine._history[version])
        machine._window_opened = None if record["window_opened"] is None else float(record["window_opened"])
        machine._target = int(record["target"])
        machine._signature = str(record["signature"])
        machine._joiners = {}
        for address, state, signature, reason, ready_order in record["joiners"]:
            j = _Joiner(peer(address), int(state), str(signature), str(reason), int(ready_order))
            machine._joiners[_key(j.peer)] = j
        machine._finished = {_key(p): p for p in map(peer, record["finished"])}
        machine._removed = {_key(peer(a)) for a in record["removed"]}
        machine._ready_count = int(record["ready_count"])
        machine._state_version = int(record["state_version"])
        step, at_version, reported_ms = record["progress"]
        machine._progress = config_pb2.JobProgress(step=step, version=at_version, reported_ms=reported_ms)
        return machine

    # ------------------------------------------------------ admission window

    @property
    def admit_window(self) -> float:
        """Seconds READY joiners may wait for the others of their growth (0: none)."""
        return self._admit_window

    def admission_deadline(self) -> float | None:
        """When (on the clock) the admission window open now ends; None if none is open."""
        with self._cond:
            return None if self._window_opened is None else self._window_opened + self._admit_window

    def admit_due(self) -> config_pb2.JobState:
        """Admits the READY joiners whose admission window has ended (or who wait for nobody now).

        Called by :meth:`run_admission_timer` when a window ends, and by tests
        that advance a fake clock.
        """
        with self._cond:
            if self._admit():
                self._changed()
            return self._snapshot()

    def run_admission_timer(self) -> None:
        """Ends every admission window on time, until :meth:`stop_admission_timer` (blocks).

        Admission otherwise happens only on requests; the config service runs
        this in a thread of its own. It sleeps while no window is open (a
        READY joiner that starts waiting wakes it, as every change does).
        """
        with self._cond:
            while not self._timer_stopped:
                if self._window_opened is None:
                    self._cond.wait()
                    continue
                remaining = self._window_opened + self._admit_window - self._clock()
                if remaining > 0:
                    self._cond.wait(remaining)
                elif self._admit():  # an ended window always closes (admitted, or nothing left to admit)
                    self._changed()

    def stop_admission_timer(self) -> None:
        """Makes :meth:`run_admission_timer` return."""
        with self._cond:
            self._timer_stopped = True
            self._cond.notify_all()

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

    def _admit(self) -> bool:
        """Admits READY joiners in ready order while size < target (lock held): one commit.

        With an admission window, READY joiners wait (without a commit) while
        other joiners that fit under the target are STARTING, until the
        window opened by the first of them ends. Returns whether it committed.
        """
        ready, expected = self._admissible()
        if not ready:
            self._window_opened = None
            return False
        if len(ready) < expected and self._admit_window > 0:
            now = self._clock()
            if self._window_opened is None:
                self._window_opened = now
            if now - self._window_opened < self._admit_window:
                return False
        self._window_opened = None
        self._commit(
            list(self._cluster.workers) + [j.peer for j in ready],
            "admitted " + ", ".join(peer_string(j.peer) for j in ready),
        )
        return True

    def _admissible(self) -> tuple[list[_Joiner], int]:
        """The READY joiners that may be admitted now, in ready order, and how many joiners
        (READY or STARTING) fit under the target (lock held)."""
        if not self._signature:
            return [], 0  # READY joiners wait until a member has set the job's signature
        if self._finished:
            return [], 0  # the job is ending: a joiner would wait for members that are gone
        room = max(self._target - len(self._cluster.workers), 0)
        ready = sorted(
            (j for j in self._joiners.values() if j.state == Joiner.READY), key=lambda j: j.ready_order
        )
        starting = sum(j.state == Joiner.STARTING for j in self._joiners.values())
        return ready[:room], min(room, len(ready) + starting)

    def _commit(self, workers: Iterable[config_pb2.PeerID], reason: str) -> None:
        """Commits the next version with ``workers`` (lock held); admitted joiners are dropped."""
        cluster = config_pb2.Cluster(version=self._cluster.version + 1)
        for w in workers:
            cluster.workers.add().CopyFrom(w)
            self._joiners.pop(_key(w), None)
        members = {_key(w) for w in cluster.workers}
        self._finished = {k: w for k, w in self._finished.items() if k in members}
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
        state.progress.CopyFrom(self._progress)
        for j in self._joiners.values():
            state.joiners.add(peer=j.peer, state=j.state, signature=j.signature, reason=j.reason)
        for w in self._finished.values():
            state.finished.add().CopyFrom(w)
        return state

    @staticmethod
    def _copy(cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        out = config_pb2.Cluster()
        out.CopyFrom(cluster)
        return out

    @staticmethod
    def _copy_peer(peer: config_pb2.PeerID) -> config_pb2.PeerID:
        return config_pb2.PeerID(host=peer.host, port=peer.port)
