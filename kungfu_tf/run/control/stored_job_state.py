"""A JobStateMachine whose record lives in a JobStore, shared by every launcher of a job.

The config service (config_server.py) serves either a JobStateMachine of its
own (one host, the default) or this: the same methods, each applied as

    load the record -> rebuild the machine -> apply the request -> compare-and-set

and retried when another launcher wrote first, so the rules stay in
job_state.py and every launcher's config service sees one job. Long polls
(WaitJobState) are answered from a copy that a thread keeps fresh by
following the store's changes (an etcd watch), not by polling it.

When the store cannot commit (etcd without quorum), a request that would
change the job fails with :class:`StoreUnavailableJobError` (gRPC
UNAVAILABLE) naming the store and why; reads answer the last state seen, so
workers keep training at their size and only membership changes wait.

Rank 0's progress reports stay in the memory of the config service that
received them (one write to a replicated store per step would cost more
than the status line is worth); other launchers' status lines show none.

Example:
    >>> from kungfu_tf.run.control.job_store import MemoryJobStore
    >>> from kungfu_tf.run.control.peer_string import parse_peer_string as p
    >>> store = MemoryJobStore()
    >>> initial = JobStateMachine(config_pb2.Cluster(version=1, workers=[p("h:1")]), elastic=True, max_size=2)
    >>> a, b = StoredJobStateMachine(store, initial), StoredJobStateMachine(store, initial)
    >>> _ = a.set_signature("w (2,) float32"); _ = a.request_size(2)
    >>> len(b.joiner_ready(p("h:2"), "w (2,) float32").cluster.workers)
    2
    >>> a.close(); b.close()
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.job_state import (
    MAX_WAIT_SECONDS,
    InvalidArgumentError,
    JobStateError,
    JobStateMachine,
)
from kungfu_tf.run.control.job_store import JobStore, StoreUnavailableError

__all__ = ["StoreUnavailableJobError", "StoredJobStateMachine"]

# Attempts at one request against concurrent writers (each attempt re-reads).
CAS_ATTEMPTS = 50
# How long a change keeps trying a store that cannot commit (etcd electing a
# leader: about one election timeout, 1 s by default) before it fails with
# UNAVAILABLE; below the workers' 10 s call timeout, so they get the reason.
STORE_RETRY_SECONDS = 5.0
STORE_RETRY_PAUSE = 0.2


class StoreUnavailableJobError(JobStateError):
    """The store cannot commit the change now; nothing changed (retry later)."""

    code = "UNAVAILABLE"


class StoredJobStateMachine:
    """JobStateMachine's interface over a :class:`JobStore` (example: the module docstring).

    ``initial`` is written as the job's first record if the store has none
    (the first launcher to start creates the job; the others find it).
    """

    def __init__(self, store: JobStore, initial: JobStateMachine):
        self._store = store
        self._cond = threading.Condition()
        self._released = 0
        self._timer_stopped = False
        self._progress = config_pb2.JobProgress()
        record, version = store.load()
        while record is None:
            record = initial.to_record()
            if store.compare_and_set(version, record):
                break
            record, version = store.load()
        self._machine = JobStateMachine.from_record(record)
        self._admit_window = self._machine.admit_window
        self._elastic = self._machine.elastic
        self._follower = threading.Thread(target=self._follow, name="kungfu-store-watch", daemon=True)
        self._follower.start()

    # -------------------------------------------------------------- follow

    def _follow(self) -> None:
        for _ in self._store.changes():
            self._refresh()

    def _refresh(self) -> JobStateMachine:
        """Re-reads the store (on failure keeps the last state); the newest machine."""
        try:
            record, _ = self._store.load()
        except StoreUnavailableError:
            record = None
        with self._cond:
            if record is not None and int(record["state_version"]) > self._machine.job_state().state_version:
                self._machine = JobStateMachine.from_record(record)
                self._cond.notify_all()
            return self._machine

    def _apply(self, change: Callable[[JobStateMachine], object]):
        """``change`` applied to the newest record and committed, retried while etcd elects a leader."""
        deadline = time.monotonic() + STORE_RETRY_SECONDS
        while True:
            try:
                return self._apply_once(change)
            except StoreUnavailableJobError:
                if time.monotonic() + STORE_RETRY_PAUSE >= deadline:
                    raise
                time.sleep(STORE_RETRY_PAUSE)

    def _apply_once(self, change: Callable[[JobStateMachine], object]):
        """``change`` applied to the newest record and committed (compare-and-set, retried)."""
        for _ in range(CAS_ATTEMPTS):
            try:
                record, version = self._store.load()
            except StoreUnavailableError as e:
                raise self._unavailable(e) from None
            assert record is not None
            machine = JobStateMachine.from_record(record)
            result = change(machine)  # a JobStateError goes to the caller: nothing to write
            new = machine.to_record()
            if new == record:
                self._adopt(machine)
                return result
            try:
                written = self._store.compare_and_set(version, new)
            except StoreUnavailableError as e:
                raise self._unavailable(e) from None
            if written:
                self._adopt(machine)
                return result
        raise StoreUnavailableJobError(
            f"{CAS_ATTEMPTS} attempts in a row lost the compare-and-set on {self._store.describe()} "
            "to other writers; nothing changed"
        )

    def _unavailable(self, e: Exception) -> StoreUnavailableJobError:
        return StoreUnavailableJobError(
            f"the config store {self._store.describe()} cannot commit now, so membership changes wait "
            f"(training goes on at its size): {e}"
        )

    def _adopt(self, machine: JobStateMachine) -> None:
        with self._cond:
            if machine.job_state().state_version >= self._machine.job_state().state_version:
                self._machine = machine
                self._cond.notify_all()

    def _current(self) -> JobStateMachine:
        with self._cond:
            return self._machine

    # --------------------------------------------------------------- reads

    @property
    def elastic(self) -> bool:
        return self._elastic

    @property
    def admit_window(self) -> float:
        return self._admit_window

    def cluster(self) -> config_pb2.Cluster:
        return self._refresh().cluster()

    def job_state(self) -> config_pb2.JobState:
        state = self._refresh().job_state()
        with self._cond:
            state.progress.CopyFrom(self._progress)
        return state

    def cluster_at(self, version: int) -> config_pb2.Cluster:
        return self._refresh().cluster_at(version)

    def commit_reason(self, version: int) -> str:
        return self._refresh().commit_reason(version)

    def admission_deadline(self) -> float | None:
        return self._current().admission_deadline()

    def wait(
        self, after_state_version: int, timeout: float, *, cancelled: Callable[[], bool] | None = None
    ) -> config_pb2.JobState:
        """As JobStateMachine.wait, woken by the store's changes."""
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or math.isnan(timeout) or timeout < 0:
            raise InvalidArgumentError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        deadline = time.monotonic() + min(timeout, MAX_WAIT_SECONDS)
        with self._cond:
            released = self._released
            while (
                self._machine.job_state().state_version <= after_state_version
                and released == self._released
                and not (cancelled is not None and cancelled())
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        return self.job_state()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def release_waiters(self) -> None:
        with self._cond:
            self._released += 1
            self._cond.notify_all()

    # ------------------------------------------------------------- changes

    def put_cluster(self, cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        return self._apply(lambda m: m.put_cluster(cluster))

    def request_size(self, size: int) -> config_pb2.JobState:
        return self._apply(lambda m: m.request_size(size))

    def report_lost(
        self, version: int, peers: Sequence[config_pb2.PeerID], reason: str = ""
    ) -> config_pb2.JobState:
        return self._apply(lambda m: m.report_lost(version, peers, reason))

    def report_finished(self, peer: config_pb2.PeerID) -> config_pb2.JobState:
        return self._apply(lambda m: m.report_finished(peer))

    def add_joiner(self, peer: config_pb2.PeerID) -> config_pb2.JobState:
        return self._apply(lambda m: m.add_joiner(peer))

    def joiner_ready(self, peer: config_pb2.PeerID, signature: str) -> config_pb2.JobState:
        return self._apply(lambda m: m.joiner_ready(peer, signature))

    def set_signature(self, signature: str, grow: bool = False) -> config_pb2.JobState:
        return self._apply(lambda m: m.set_signature(signature, grow))

    def remove_joiner(self, peer: config_pb2.PeerID) -> config_pb2.JobState:
        return self._apply(lambda m: m.remove_joiner(peer))

    def report_progress(self, step: int, version: int) -> None:
        """Kept in this process only (see the module docstring)."""
        with self._cond:
            reported_ms = max(1, int(time.monotonic() * 1000))
            self._progress = config_pb2.JobProgress(step=step, version=version, reported_ms=reported_ms)

    def admit_due(self) -> config_pb2.JobState:
        return self._apply(lambda m: m.admit_due())

    def run_admission_timer(self) -> None:
        """Ends admission windows on time (every launcher runs one; the CAS makes them agree)."""
        while True:
            with self._cond:
                if self._timer_stopped:
                    return
                deadline = self._machine.admission_deadline()
                wait = 1.0 if deadline is None else min(1.0, max(deadline - time.time(), 0.0))
                if wait > 0:
                    self._cond.wait(wait)
                    continue
            try:
                self.admit_due()
            except StoreUnavailableJobError:
                with self._cond:
                    self._cond.wait(1.0)

    def stop_admission_timer(self) -> None:
        with self._cond:
            self._timer_stopped = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stops following the store (the store itself is closed by its owner)."""
        self.release_waiters()
        self.stop_admission_timer()
