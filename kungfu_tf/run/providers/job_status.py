"""The job's status on the launcher's terminal: cluster version and size, step, steps/s, elapsed time.

On a terminal (stderr is a TTY) one line at the bottom is rewritten in place
about every second; otherwise a plain ``[kungfu-run] status: ...`` line is
printed every ``kungfu-run --status-every`` seconds (see
:meth:`kungfu_tf.run.providers.output.Console.status`). Membership changes are
printed as they happen by the elastic supervisor, either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kungfu_tf.run.providers.output import Console

DEFAULT_STATUS_EVERY = 30.0  # seconds between plain status lines (kungfu-run --status-every)
TTY_REFRESH = 1.0  # seconds between two rewrites of the line on a terminal


@dataclass(frozen=True)
class JobStatus:
    """What the status line says; ``version``/``step``/``steps_per_s`` are None when unknown."""

    elapsed: float
    workers: int
    version: int | None = None
    step: int | None = None
    steps_per_s: float | None = None


def format_duration(seconds: float) -> str:
    """``42s``, ``5m03s``, ``2h05m``.

    Example:
        >>> format_duration(42.7), format_duration(303), format_duration(7500)
        ('42s', '5m03s', '2h05m')
    """
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_rate(rate: float) -> str:
    """Steps/s rounded to what a reader can use: ``0.25``, ``12.5``, ``340``."""
    if rate < 1:
        return f"{rate:.2f}"
    if rate < 100:
        return f"{rate:.1f}"
    return f"{rate:.0f}"


def format_status(status: JobStatus) -> str:
    """One line, e.g. ``cluster v3, 4 workers, step 1200 (12.5 steps/s), 5m03s elapsed``.

    Example:
        >>> format_status(JobStatus(elapsed=303, workers=4, version=3, step=1200, steps_per_s=12.5))
        'cluster v3, 4 workers, step 1200 (12.5 steps/s), 5m03s elapsed'
        >>> format_status(JobStatus(elapsed=5, workers=1))
        '1 worker, 5s elapsed'
    """
    parts = []
    if status.version is not None:
        parts.append(f"cluster v{status.version}")
    parts.append(f"{status.workers} worker{'' if status.workers == 1 else 's'}")
    if status.step is not None:
        rate = f" ({format_rate(status.steps_per_s)} steps/s)" if status.steps_per_s is not None else ""
        parts.append(f"step {status.step}{rate}")
    parts.append(f"{format_duration(status.elapsed)} elapsed")
    return ", ".join(parts)


class StepRate:
    """Steps/s from successive progress reports (step, time of the report in ms).

    The same report read twice keeps the last rate; a step that went back
    (the job restarted from a checkpoint) starts over.

    Example:
        >>> rate = StepRate()
        >>> rate.update(100, 1000), rate.update(150, 3000), rate.update(150, 3000)
        (None, 25.0, 25.0)
    """

    def __init__(self) -> None:
        self._last: tuple[int, int] | None = None
        self._rate: float | None = None

    def update(self, step: int, reported_ms: int) -> float | None:
        """Take in the newest report; the rate between the last two distinct ones (None: not yet)."""
        if reported_ms == 0:
            return None
        if self._last is not None and reported_ms != self._last[1]:
            last_step, last_ms = self._last
            if step < last_step or reported_ms < last_ms:
                self._rate = None
            else:
                self._rate = (step - last_step) * 1000.0 / (reported_ms - last_ms)
        self._last = (step, reported_ms)
        return self._rate


class StatusDisplay:
    """Decides when the status is due and hands it to the console.

    ``every`` is ``--status-every`` seconds (0: no status at all); on a
    terminal the line is rewritten every :data:`TTY_REFRESH` seconds instead.
    """

    def __init__(self, console: Console, every: float, *, clock: Callable[[], float] = time.monotonic):
        self._console = console
        self._clock = clock
        self._started = clock()
        self._interval = 0.0 if every <= 0 else (TTY_REFRESH if console.status_in_place else every)
        self._next = self._started + self._interval
        self._rate = StepRate()

    @property
    def enabled(self) -> bool:
        return self._interval > 0

    def due(self) -> bool:
        """Whether a status should be shown now."""
        return self.enabled and self._clock() >= self._next

    def show(self, workers: int, version: int | None = None, progress=None) -> None:
        """Show the status now: ``progress`` is a JobProgress (step, version, reported_ms) or None."""
        now = self._clock()
        self._next = now + self._interval
        step = rate = None
        if progress is not None and progress.reported_ms:
            step = int(progress.step)
            rate = self._rate.update(step, int(progress.reported_ms))
        status = JobStatus(elapsed=now - self._started, workers=workers, version=version, step=step, steps_per_s=rate)
        self._console.status(format_status(status))

    def close(self) -> None:
        """Take the in-place line off the terminal (before the launcher's last words)."""
        self._console.clear_status()
