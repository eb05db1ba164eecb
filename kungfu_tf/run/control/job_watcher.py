"""Watches an elastic job's state from a background thread (long poll of WaitJobState).

Launchers and workers both need the newest JobState without asking for it on
every step: a :class:`JobWatcher` keeps one WaitJobState call open against the
config service, so it learns of every change (a committed cluster version, a
new target size, a joiner's state) within a round trip, while an idle job
costs one call per ``poll_timeout``. Readers take :meth:`JobWatcher.latest`
(no RPC), block with :meth:`JobWatcher.wait_for`, or register callbacks.

An unreachable config service is retried (with backoff) for up to
``unreachable_timeout`` seconds; after that, or at once if the service
refuses the call (wrong secret, a state from another server), the watcher
stops and ``wait_for`` raises :class:`JobWatcherError` naming the cause.

Example::

    with ConfigClient(address, secret=secret, job_id=job_id) as client, JobWatcher(client) as watcher:
        seen = watcher.latest().cluster.version
        state = watcher.wait_for(lambda s: s.cluster.version > seen, timeout=60.0)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Self

import grpc

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import ConfigClient, PendingCall

__all__ = ["JobWatcher", "JobWatcherError"]

_log = logging.getLogger(__name__)

# Worth retrying: the service is down, restarting, busy, or the call was cut.
_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)
_FIRST_BACKOFF_SECONDS = 0.1
_MAX_BACKOFF_SECONDS = 2.0

Callback = Callable[[config_pb2.JobState], None]


class JobWatcherError(RuntimeError):
    """The watcher stopped watching: the config service refused it or stayed unreachable."""


def _describe(state: config_pb2.JobState) -> str:
    return (
        f"cluster version {state.cluster.version} with {len(state.cluster.workers)} workers, "
        f"target size {state.target_size}, {len(state.joiners)} joiners, state_version {state.state_version}"
    )


class JobWatcher:
    """Keeps the newest JobState of the job served at ``client``'s address.

    Args:
      client: an open ConfigClient (the watcher uses it from its own thread;
        the caller keeps owning it and closes it after stop()).
      on_change: called with each newer JobState, in order, from the watcher
        thread (keep it short: the next poll starts when it returns; an
        exception is logged and watching goes on).
      poll_timeout: seconds each long poll may wait on the server (<= 60).
      unreachable_timeout: seconds of failed polls in a row before giving up.
      start: fetch the first state and start the thread now (otherwise call
        :meth:`start`).

    Raises (from start):
      grpc.RpcError: the first GetJobState failed (e.g. PERMISSION_DENIED
        for a wrong secret, UNAVAILABLE for no server).

    Example::

        watcher = JobWatcher(client, on_change=lambda s: print("now", s.cluster.version))
        ...
        watcher.stop()
    """

    def __init__(
        self,
        client: ConfigClient,
        *,
        on_change: Callback | None = None,
        poll_timeout: float = 30.0,
        unreachable_timeout: float = 60.0,
        start: bool = True,
    ):
        if not 0 < poll_timeout <= 60:
            raise ValueError(f"poll_timeout must be in (0, 60] seconds, got {poll_timeout!r}")
        if not unreachable_timeout > 0:
            raise ValueError(f"unreachable_timeout must be > 0 seconds, got {unreachable_timeout!r}")
        self._client = client
        self._poll_timeout = poll_timeout
        self._unreachable_timeout = unreachable_timeout
        self._callbacks: list[Callback] = [on_change] if on_change is not None else []
        self._cond = threading.Condition()
        self._latest: config_pb2.JobState | None = None
        self._error: JobWatcherError | None = None
        self._stopping = threading.Event()
        self._pending: PendingCall | None = None
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def start(self) -> Self:
        """Fetches the current state (synchronously) and starts watching."""
        if self._thread is not None:
            raise RuntimeError("JobWatcher already started")
        first = self._client.get_job_state()
        with self._cond:
            self._latest = first
        self._thread = threading.Thread(target=self._run, name="kungfu-job-watcher", daemon=True)
        self._thread.start()
        return self

    def latest(self) -> config_pb2.JobState:
        """The newest JobState seen (no RPC)."""
        with self._cond:
            if self._latest is None:
                raise RuntimeError("JobWatcher not started: call start() first")
            return self._latest

    @property
    def error(self) -> JobWatcherError | None:
        """Why the watcher stopped on its own, or None while it watches."""
        with self._cond:
            return self._error

    def add_callback(self, callback: Callback) -> None:
        """Also calls ``callback`` with each newer JobState (from the watcher thread)."""
        with self._cond:
            self._callbacks.append(callback)

    def wait_for(
        self, predicate: Callable[[config_pb2.JobState], bool], timeout: float | None
    ) -> config_pb2.JobState:
        """The first JobState (the latest one included) for which ``predicate`` is true.

        ``predicate`` runs under the watcher's lock: keep it a cheap test of
        the state. ``timeout`` None waits without limit.

        Raises:
            TimeoutError: nothing matched within ``timeout`` seconds (names the latest state).
            JobWatcherError: the watcher stopped (stop(), refused, unreachable).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._latest is not None and predicate(self._latest):
                    return self._latest
                if self._error is not None:
                    raise self._error
                if self._stopping.is_set():
                    raise JobWatcherError("JobWatcher stopped before the awaited state arrived")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    latest = _describe(self._latest) if self._latest is not None else "no state yet"
                    raise TimeoutError(
                        f"no job state matched within {timeout} s (latest: {latest}) "
                        f"from the config service at {self._client.address}"
                    )
                self._cond.wait(remaining)

    def stop(self, timeout: float = 5.0) -> None:
        """Stops watching: cancels the poll in flight and joins the thread. Idempotent."""
        with self._cond:
            self._stopping.set()
            pending = self._pending
            self._cond.notify_all()
        if pending is not None:
            pending.cancel()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------- internals

    def _run(self) -> None:
        failing_since: float | None = None
        backoff = _FIRST_BACKOFF_SECONDS
        while not self._stopping.is_set():
            try:
                state = self._poll_once()
            except grpc.FutureCancelledError:
                break  # stop() cancelled the poll
            except ValueError as e:  # grpc: "Cannot invoke RPC on closed channel!"
                if not self._stopping.is_set():
                    self._fail(f"cannot poll the config service at {self._client.address}: {e} (client closed?)")
                return
            except grpc.RpcError as e:
                if self._stopping.is_set():
                    break
                code = e.code() if callable(getattr(e, "code", None)) else None
                details = e.details() if callable(getattr(e, "details", None)) else str(e)
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if code not in _RETRYABLE:
                    self._fail(
                        f"the config service at {self._client.address} refused WaitJobState: "
                        f"{code.name if code else 'error'}: {details}"
                    )
                    return
                if now - failing_since >= self._unreachable_timeout:
                    self._fail(
                        f"the config service at {self._client.address} was unreachable for "
                        f"{now - failing_since:.1f} s (unreachable_timeout={self._unreachable_timeout} s): "
                        f"{code.name if code else 'error'}: {details}"
                    )
                    return
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF_SECONDS)
                continue
            failing_since, backoff = None, _FIRST_BACKOFF_SECONDS
            if state is not None:
                self._publish(state)

    def _poll_once(self) -> config_pb2.JobState | None:
        """One long poll; the new state, or None if nothing changed."""
        after = self.latest().state_version
        pending = self._client.start_wait_job_state(after, self._poll_timeout)
        with self._cond:
            self._pending = pending
            stopping = self._stopping.is_set()
        if stopping:
            pending.cancel()
        try:
            state = pending.result()
        finally:
            with self._cond:
                self._pending = None
        return state if state.state_version > after else None

    def _publish(self, state: config_pb2.JobState) -> None:
        with self._cond:
            self._latest = state
            callbacks = list(self._callbacks)
            self._cond.notify_all()
        for callback in callbacks:
            try:
                callback(state)
            except Exception:  # noqa: BLE001 -- a user callback must not end the watching
                _log.exception("JobWatcher callback %r failed on %s", callback, _describe(state))

    def _fail(self, message: str) -> None:
        _log.error("JobWatcher stopped: %s", message)
        with self._cond:
            self._error = JobWatcherError(message)
            self._cond.notify_all()
