"""Shared helpers for the multi-worker tests: launching real jobs.

Every job is started exactly as users start one,
``python -m kungfu_tf.run -np N [launcher args] python worker.py args``, in its
own session so that a hung job can be torn down completely (launcher, workers
and anything they forked) without touching other processes.

Worker scripts live in ``tests/workers/``; they check their own results
against numpy and print ``checked N results`` at the end, which the tests
compare with the count they expect (so a worker that skips work fails).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKERS_DIR = Path(__file__).resolve().parent / "workers"

# "[3] some text": one line of worker output relayed by the launcher.
PREFIXED_LINE = re.compile(r"^\[(\d+)\] (.*)$")
CHECKED_LINE = re.compile(r"^checked (\d+) results$")


class JobTimeout(AssertionError):
    """A job outlived its hard timeout (it has been killed)."""


def worker_env(**extra: str) -> dict[str, str]:
    """This process's environment without stray KUNGFU_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def worker_path(script: str | os.PathLike[str]) -> str:
    """``script`` as an absolute path; bare names are looked up in tests/workers."""
    p = Path(script)
    if not p.is_absolute():
        p = WORKERS_DIR / p
    if not p.exists():
        raise FileNotFoundError(p)
    return str(p)


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (None if gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name may contain spaces and parentheses: split after it.
    return stat[stat.rfind(")") + 2 :].split()


def _descendants(pid: int) -> list[tuple[int, str]]:
    """(pid, start time) of every live descendant of ``pid``.

    ``pid`` must not have been reaped yet (or its number could be reused);
    the start time identifies each process, so that a number reused later
    is never signalled by mistake.
    """
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None:
            continue
        # fields[1] is the parent pid, fields[19] the start time.
        children.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
    out: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child[0])
    return out


def kill_tree(proc: subprocess.Popen, grace: float = 8.0) -> None:
    """Stop a launcher started by :func:`start_job` and everything below it.

    SIGTERM first (the launcher then stops its workers, which are in process
    groups of their own), SIGKILL to whatever is left after ``grace`` seconds.
    Only processes that descend from ``proc`` are signalled.
    """
    if proc.poll() is not None:
        return  # reaped: its workers die with it (PR_SET_PDEATHSIG)
    doomed = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)  # start_new_session: the group is the launcher's
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid, started in doomed:
        fields = _stat(pid)
        if fields is not None and fields[19] == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def start_job(
    np: int,
    script: str | os.PathLike[str],
    *args: object,
    extra_launcher_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """Start ``kungfu-run -np N ... python script args`` in its own session."""
    cmd = [
        sys.executable,
        "-m",
        "kungfu_tf.run",
        "-np",
        str(np),
        *extra_launcher_args,
        sys.executable,
        worker_path(script),
        *(str(a) for a in args),
    ]
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env if env is not None else worker_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish_job(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    """Wait for a job from :func:`start_job`; kill it and fail on timeout."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", "(output lost: pipes still held open)"
        raise JobTimeout(
            f"job {proc.args!r} did not finish within {timeout}s and was killed\n"
            f"--- stdout ---\n{out[-20000:]}\n--- stderr ---\n{err[-20000:]}"
        ) from None
    return proc.returncode, out, err


def run_job(
    np: int,
    script: str | os.PathLike[str],
    *args: object,
    timeout: float = 120,
    extra_launcher_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """Run a job to completion: (returncode, stdout, stderr).

    The job is killed (whole process tree) if it outlives ``timeout``
    seconds, and :class:`JobTimeout` is raised with its output so far.
    """
    return finish_job(start_job(np, script, *args, extra_launcher_args=extra_launcher_args, env=env), timeout)


def rank_lines(text: str) -> dict[int, list[str]]:
    """Worker output grouped by rank (launcher lines are ignored)."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = PREFIXED_LINE.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def checked_counts(stdout: str) -> dict[int, int]:
    """rank -> N from each worker's final ``checked N results`` line."""
    counts: dict[int, int] = {}
    for rank, lines in rank_lines(stdout).items():
        for line in lines:
            m = CHECKED_LINE.match(line)
            if m:
                counts[rank] = int(m.group(1))
    return counts


def describe(rc: int, out: str, err: str, limit: int = 12000) -> str:
    """A job's result for assertion messages."""
    return f"exit code {rc}\n--- stdout ---\n{out[-limit:]}\n--- stderr ---\n{err[-limit:]}"


def assert_job_ok(rc: int, out: str, err: str, np: int, expected_checks: int | None = None) -> dict[int, int]:
    """Exit code 0 and every rank reported its ``checked N results`` line
    (with N == ``expected_checks`` if given). Returns the counts."""
    assert rc == 0, describe(rc, out, err)
    counts = checked_counts(out)
    assert sorted(counts) == list(range(np)), f"ranks that reported: {sorted(counts)}\n" + describe(rc, out, err)
    if expected_checks is not None:
        assert counts == dict.fromkeys(range(np), expected_checks), (
            f"expected every rank to check {expected_checks} results, got {counts}\n" + describe(rc, out, err)
        )
    return counts
