"""A background long poll of an elastic job's JobState (WaitJobState).

The launcher's main thread must stay free to start processes (the
parent-death signal is tied to the thread that forks) and to react to
signals, so the blocking long poll runs in a daemon thread that only keeps
the newest state it got, and since when the config service is unreachable.

Example::

    watcher = JobStateWatcher(client)
    ...
    state = watcher.latest()        # newest JobState, or None before the first
    trouble = watcher.trouble()     # (since, message) while unreachable
    watcher.stop()
"""

from __future__ import annotations

import threading
import time

import grpc

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.config_server import ConfigClient

# One long poll's length; short enough for stop() to take effect soon.
LONG_POLL_SECONDS = 2.0
# Pause before polling again after a failed call.
RETRY_SECONDS = 0.25


def rpc_error_text(error: grpc.RpcError) -> str:
    """``CODE: details`` of a gRPC error (``str()`` of one is a wall of text)."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = error.details() if callable(getattr(error, "details", None)) else str(error)
    return f"{code.name if code is not None else 'ERROR'}: {details}"


class JobStateWatcher:
    """Long-polls ``client`` for JobStates newer than the newest one it has."""

    def __init__(self, client: ConfigClient, after_state_version: int = 0):
        """Start watching in a daemon thread."""
        self._client = client
        self._lock = threading.Lock()
        self._latest: config_pb2.JobState | None = None
        self._after = after_state_version
        self._trouble: tuple[float, str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kungfu-job-state", daemon=True)
        self._thread.start()

    def latest(self) -> config_pb2.JobState | None:
        """The newest JobState received (None before the first answer)."""
        with self._lock:
            return self._latest

    def trouble(self) -> tuple[float, str] | None:
        """``(monotonic time of the first failure, message)`` while calls fail, else None."""
        with self._lock:
            return self._trouble

    def stop(self) -> None:
        """Stop after the current long poll (at most LONG_POLL_SECONDS)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                state = self._client.wait_job_state(self._after, LONG_POLL_SECONDS)
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return
                with self._lock:
                    if self._trouble is None:
                        self._trouble = (time.monotonic(), rpc_error_text(e))
                    else:
                        self._trouble = (self._trouble[0], rpc_error_text(e))
                self._stop.wait(RETRY_SECONDS)
                continue
            with self._lock:
                self._trouble = None
                if self._latest is None or state.state_version > self._latest.state_version:
                    self._latest = state
                self._after = max(self._after, state.state_version)
