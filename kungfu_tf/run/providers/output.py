"""Relaying worker output line by line with a ``[rank] `` prefix."""

import shutil
import sys
import threading
from collections.abc import Callable
from typing import IO, BinaryIO, TextIO

from kungfu_tf.run.providers.startup_noise import is_tf_startup_noise

_ERASE_LINE = b"\r\x1b[K"  # carriage return, then erase to the end of the line


class Console:
    """The launcher's stdout/stderr, written one whole line at a time.

    One lock covers both streams because they often share a terminal;
    without it lines from different ranks could interleave mid-line.
    """

    def __init__(
        self,
        stdout: TextIO | None = None,
        stderr: TextIO | None = None,
        *,
        hide_tf_startup: bool = False,
        status_every: float = 0.0,
    ):
        """Use the given streams, defaulting to ``sys.stdout``/``sys.stderr``.

        ``hide_tf_startup``: workers' TensorFlow start-up notices (see
        :mod:`kungfu_tf.run.providers.startup_noise`) are not echoed.
        ``status_every``: ``kungfu-run --status-every`` seconds, read by the
        supervisors' job status (0: none; see providers/job_status.py).
        """
        self._stdout = stdout if stdout is not None else sys.stdout
        self._stderr = stderr if stderr is not None else sys.stderr
        self._lock = threading.Lock()
        self.hide_tf_startup = hide_tf_startup
        self.status_every = status_every
        try:
            self.status_in_place = bool(self._stderr.isatty())
        except (AttributeError, ValueError):
            self.status_in_place = False
        self._status_line = b""  # the status now drawn at the bottom of the terminal (in place)

    def shows(self, worker_line: bytes) -> bool:
        """Whether a worker's output line (without the rank prefix) is echoed."""
        return not (self.hide_tf_startup and is_tf_startup_noise(worker_line))

    def out(self, line: bytes) -> None:
        """Write a complete line (ending in newline) to stdout."""
        self._write(self._stdout, line)

    def err(self, line: bytes) -> None:
        """Write a complete line (ending in newline) to stderr."""
        self._write(self._stderr, line)

    def message(self, text: str) -> None:
        """Print a launcher diagnostic as ``kungfu-run: text`` on stderr."""
        self._write(self._stderr, f"kungfu-run: {text}\n".encode())

    def event(self, text: str) -> None:
        """Print an event of an elastic job as ``[kungfu-run] text`` on stderr.

        Membership changes look like worker lines (``[rank] ...``) so that
        they read in order among them, e.g.
        ``[kungfu-run] cluster v3: 4 -> 3 workers (lost 127.0.0.1:10002: killed by SIGKILL)``.
        """
        self._write(self._stderr, f"[kungfu-run] {text}\n".encode())

    def status(self, text: str) -> None:
        """Show the job's status: rewritten in place on a terminal, else a ``[kungfu-run] status: text`` line.

        In place, the line is taken off before any other line is written and
        drawn again after it, so it stays at the bottom and never runs into
        a worker's line.
        """
        if not self.status_in_place:
            self._write(self._stderr, f"[kungfu-run] status: {text}\n".encode())
            return
        width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be rewritten
        line = f"[kungfu-run] {text}"[: max(width, 20)].encode()
        with self._lock:
            self._put(self._stderr, _ERASE_LINE + line)
            self._status_line = line

    def clear_status(self) -> None:
        """Take the in-place status line off the terminal (nothing otherwise)."""
        with self._lock:
            if self._status_line:
                self._put(self._stderr, _ERASE_LINE)
                self._status_line = b""

    def _write(self, stream: TextIO, data: bytes) -> None:
        with self._lock:
            if self._status_line:
                self._put(self._stderr, _ERASE_LINE)
            self._put(stream, data)
            if self._status_line:
                self._put(self._stderr, self._status_line)

    @staticmethod
    def _put(stream: TextIO, data: bytes) -> None:
        """Write ``data`` to ``stream`` and flush (the caller holds the lock)."""
        try:
            buffer = getattr(stream, "buffer", None)
            if buffer is None:
                # Text-only streams (e.g. io.StringIO in tests).
                stream.write(data.decode("utf-8", errors="replace"))
                stream.flush()
            else:
                # Flush pending text first so ordering is preserved.
                stream.flush()
                buffer.write(data)
                buffer.flush()
        except (OSError, ValueError):
            # A closed or broken stdout (e.g. piped into `head`) must
            # not stop draining the pipes, or workers would block.
            pass


class OutputRelay:
    """Two reader threads copying one worker's stdout/stderr to the console.

    A thread per pipe is the simplest way to read both without one pipe
    filling up (and blocking the worker) while the other is waited on.
    """

    def __init__(
        self,
        rank: int,
        stdout: IO[bytes],
        stderr: IO[bytes],
        console: Console,
        *,
        echo: bool,
        log: BinaryIO | None,
    ):
        """Prepare to relay; nothing is read until :meth:`start`.

        ``log`` (opened by the caller, so that a log file that cannot be
        written is reported before any worker starts) also receives the raw
        output; :meth:`join` closes it.
        """
        self._prefix = f"[{rank}] ".encode()
        self._console = console
        self._echo = echo
        self._log = log
        self._log_lock = threading.Lock()
        self._threads = [
            threading.Thread(
                target=self._pump,
                args=(stdout, console.out),
                name=f"rank{rank}-stdout",
                daemon=True,
            ),
            threading.Thread(
                target=self._pump,
                args=(stderr, console.err),
                name=f"rank{rank}-stderr",
                daemon=True,
            ),
        ]

    def start(self) -> None:
        """Start both reader threads."""
        for t in self._threads:
            t.start()

    def join(self, timeout: float) -> None:
        """Wait for both pipes to reach EOF, at most ``timeout`` seconds each.

        A grandchild that inherited the pipes can keep them open after the
        worker exits; the timeout stops that from hanging the launcher.
        """
        for t in self._threads:
            if t.ident is not None:  # never started if spawning failed
                t.join(timeout)
        self.close_log()

    def close_log(self) -> None:
        """Close the log file (reader threads that still run stop writing to it)."""
        with self._log_lock:
            if self._log is not None:
                self._log.close()
                self._log = None

    def _pump(self, pipe: IO[bytes], echo_line: Callable[[bytes], None]) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                with self._log_lock:
                    if self._log is not None:
                        self._log.write(line)
                        self._log.flush()
                if self._echo and self._console.shows(line):
                    if not line.endswith(b"\n"):
                        line += b"\n"
                    echo_line(self._prefix + line)
