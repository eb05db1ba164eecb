"""Launching benchmark process groups on loopback, with guaranteed cleanup.

Every child is started in its own session (= its own process group) so that
it and anything it spawns (e.g. the workers of ``kungfu-run``) can be
signalled by that group id alone, without touching unrelated processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from benchmarks.harness.paths import REPO

LOOPBACK = "127.0.0.1"

# Quiet TF's C++ start-up chatter so worker failures are readable.
WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def log(msg: str) -> None:
    """Progress goes to stderr so stdout holds only the report."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for benchmark children: this checkout first on the import path.

    The checkout, so that the workers (started by path) import ``benchmarks.*``
    and measure the kungfu_tf next to this script even when another checkout
    is the one installed in the venv.
    """
    env = dict(os.environ, **WORKER_ENV)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([path] if path else []))
    env.update(extra or {})
    return env


def free_ports(count: int) -> list[int]:
    """Returns ``count`` distinct currently-free TCP ports on loopback.

    All sockets are held open until every port is chosen so that the kernel
    cannot hand out the same port twice; there is still a small window
    between closing them and the consumer binding, which is acceptable for a
    benchmark on an otherwise idle loopback interface.
    """
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((LOOPBACK, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class ProcResult:
    """Outcome of one child process of a group."""

    argv: list[str]
    returncode: int | None  # None: had to be killed (timeout or peer failure)
    lines: list[str] = field(default_factory=list)  # merged stdout + stderr

    @property
    def ok(self) -> bool:
        """True if the process exited on its own with status 0."""
        return self.returncode == 0

    def tail(self, n: int = 30) -> str:
        """The last ``n`` output lines, for error reports."""
        return "\n".join(self.lines[-n:])


def _kill_group(proc: subprocess.Popen[str], grace_s: float = 3.0) -> None:
    """Terminates the still-running process group led by ``proc``.

    SIGTERM first so launchers can tear down their own children, then
    SIGKILL for whatever ignored it.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


def _pump(
    proc: subprocess.Popen[str],
    sink: list[str],
    on_line: Callable[[str], None] | None,
) -> None:
    """Collects the output of ``proc`` line by line (runs in a thread)."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip("\n")
        sink.append(line)
        if on_line is not None:
            on_line(line)


def run_group(
    argvs: Sequence[Sequence[str]],
    envs: Sequence[dict[str, str]] | None = None,
    timeout_s: float = 600.0,
    on_line: Callable[[int, str], None] | None = None,
    cwd: str | None = None,
) -> list[ProcResult]:
    """Runs the commands concurrently and waits for all of them.

    If any process fails, or the deadline passes, the remaining ones are
    killed at once: collective peers of a dead process would otherwise hang
    until their own (much longer) timeouts. ``on_line(index, line)`` is
    called for every output line as it arrives (for live progress).
    """
    procs: list[subprocess.Popen[str]] = []
    results: list[ProcResult] = []
    pumps: list[threading.Thread] = []
    try:
        for i, argv in enumerate(argvs):
            env = dict(envs[i]) if envs is not None else dict(os.environ)
            proc = subprocess.Popen(
                list(argv),
                env=env,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
            )
            procs.append(proc)
            res = ProcResult(argv=list(argv), returncode=None)
            results.append(res)
            cb = (lambda line, i=i: on_line(i, line)) if on_line else None
            t = threading.Thread(target=_pump, args=(proc, res.lines, cb), daemon=True)
            t.start()
            pumps.append(t)

        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0) for c in codes):
                break  # a peer failed: the rest cannot finish
            if time.monotonic() > deadline:
                print(f"[bench] timeout after {timeout_s:.0f} s", file=sys.stderr)
                break
            time.sleep(0.05)
    finally:
        killed = set()
        for i, p in enumerate(procs):
            # Only groups whose leader is still alive: a reaped leader's pid
            # may already belong to someone else.
            if p.poll() is None:
                _kill_group(p)
                killed.add(i)
        for t in pumps:
            t.join(timeout=5.0)
        for i, (p, r) in enumerate(zip(procs, results, strict=True)):
            r.returncode = None if i in killed else p.returncode
    return results
