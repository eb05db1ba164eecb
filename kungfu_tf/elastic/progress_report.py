"""Rank 0's training progress, sent to the config service for kungfu-run's job status.

``ElasticState.commit`` offers (step, cluster version) at most every
:data:`REPORT_EVERY` seconds, on rank 0 only; a daemon thread sends the newest
offer (one ReportProgress call), so a slow or unreachable config service never
holds up a step. The launcher turns two reports into steps/s.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("kungfu_tf.elastic")

REPORT_EVERY = 2.0  # seconds between two offers, and so between two ReportProgress calls


class ProgressReporter:
    """Sends the newest offered ``(step, version)`` with ``send`` from its own thread.

    Example:
        >>> sent = []
        >>> reporter = ProgressReporter(lambda step, version: sent.append((step, version)))
        >>> reporter.offer(10, 2); reporter.flush(timeout=5); sent
        [(10, 2)]
    """

    def __init__(self, send: Callable[[int, int], None]):
        self._send = send
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending: tuple[int, int] | None = None
        self._busy = False
        self._thread: threading.Thread | None = None
        self._failed = False

    def offer(self, step: int, version: int) -> None:
        """Remember ``(step, version)`` for the sending thread; never blocks on the network."""
        with self._lock:
            self._pending = (step, version)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kungfu-progress-report", daemon=True)
                self._thread.start()
            self._wake.notify_all()

    def flush(self, timeout: float) -> None:
        """Wait until the newest offer was sent (or failed), at most ``timeout`` seconds."""
        with self._lock:
            self._wake.wait_for(lambda: self._pending is None and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                self._wake.wait_for(lambda: self._pending is not None)
                assert self._pending is not None
                step, version = self._pending
                self._pending, self._busy = None, True
            try:
                self._send(step, version)
            except Exception as e:  # noqa: BLE001 - the status line misses a report; training goes on
                if not self._failed:
                    self._failed = True
                    log.debug("kungfu elastic: cannot report progress to the config service: %s", e)
            finally:
                with self._lock:
                    self._busy = False
                    self._wake.notify_all()
