"""CPU quotas for tests and benchmarks: a cgroup v1 ``cpu`` group per quota (root).

``CpuQuota(1.0)`` creates ``/sys/fs/cgroup/cpu/kfquota-<pid>-<n>/`` with
``cpu.cfs_quota_us / cpu.cfs_period_us = 1.0`` (the processes inside share
one core's worth of CPU time, however many cores the machine has);
``add(pid)`` moves a process (all its threads) in, and the processes it
starts afterwards are born inside. ``close()`` moves whatever is still
inside back to the root group and removes the directory; it also runs at
exit of the ``with`` block.

Used two ways:

* a whole job: ``subprocess.Popen(cmd, preexec_fn=quota.enter)`` puts the
  launcher into the group before it executes, so every worker (and every
  joiner started later) is inside: the job's aggregate throughput stops
  growing once its workers use the quota;
* one worker: ``quota.add(worker_pids(launcher_pid)[peer])`` slows that
  worker alone (a straggler); its replacement, a new process, is not inside.

Tests import it (``from cgroup_quota import CpuQuota``, tests/ is on the
path); benchmarks add tests/ to ``sys.path`` as benchmarks/harness/hosts.py
does for tests/netns.py. Production code never imports it.

Example:
    >>> with CpuQuota(0.5) as quota:                            # doctest: +SKIP
    ...     proc = subprocess.Popen(["python", "-c", "..."], preexec_fn=quota.enter)
    ...     proc.wait()
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
_counter = itertools.count()


class QuotaUnavailable(RuntimeError):
    """No writable cgroup v1 ``cpu`` hierarchy here (not root, or cgroup v2 only)."""


def unavailable_reason() -> str | None:
    """Why :class:`CpuQuota` cannot work here, or None if it can."""
    if not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {CPU_ROOT} (cpu.cfs_quota_us missing)"
    if not os.access(CPU_ROOT, os.W_OK):
        return f"{CPU_ROOT} is not writable (needs root)"
    return None


class CpuQuota:
    """A cgroup whose processes together get at most ``cpus`` cores of CPU time (see the module docstring).

    Args:
        cpus: the quota in cores (> 0; 0.5 = half a core, 2 = two cores).
        name: directory name under /sys/fs/cgroup/cpu (default unique per process and call).
        shares: the group's ``cpu.shares``. CFS schedules a group as one
            entity of this weight against the other processes of the root
            group (1024 each): with the default 1024 a busy machine pushes the
            whole group below its quota and the quota stops being what limits
            it. The default, 16384, lets the quota bind on a loaded machine
            (it never gives the group more than its quota).

    Raises:
        ValueError: ``cpus`` is not a positive finite number.
        QuotaUnavailable: no writable cgroup v1 cpu hierarchy.
    """

    def __init__(self, cpus: float, name: str | None = None, shares: int = 16384):
        self.path = CPU_ROOT / (name or f"kfquota-{os.getpid()}-{next(_counter)}")
        reason = unavailable_reason()
        if reason is not None:
            raise QuotaUnavailable(f"CpuQuota({cpus}): {reason}")
        self.path.mkdir()
        try:
            self.set(cpus)
            (self.path / "cpu.shares").write_text(str(int(shares)))
            # Written once here (open() in the child between fork and exec would allocate).
            self._procs = str(self.path / "cgroup.procs")
        except BaseException:
            self.path.rmdir()
            raise

    def set(self, cpus: float) -> None:
        """Changes the quota (takes effect within one period, 100 ms)."""
        if isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not 0 < cpus < float("inf"):
            raise ValueError(f"CpuQuota: cpus must be a finite number > 0 (cores), got {cpus!r}")
        (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self.path / "cpu.cfs_quota_us").write_text(str(max(1000, round(cpus * PERIOD_US))))
        self.cpus = float(cpus)

    def add(self, pid: int) -> None:
        """Moves process ``pid`` (every thread of it) into the group."""
        with open(self._procs, "w") as f:
            f.write(str(pid))

    def enter(self) -> None:
        """Moves the calling process in: ``Popen(..., preexec_fn=quota.enter)``."""
        fd = os.open(self._procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def inherited(self) -> Iterator[None]:
        """Processes started inside the block are born inside the group (this process moves in, then back).

        For launchers one cannot give a ``preexec_fn``, e.g. ``tests/conftest.py``'s ``start_job``.
        """
        before = _own_cpu_group()
        self.enter()
        try:
            yield
        finally:
            (before / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def usage_seconds(self) -> float:
        """CPU time used by the group's processes so far (cpuacct, if mounted; else nan)."""
        acct = Path("/sys/fs/cgroup/cpuacct") / self.path.name / "cpuacct.usage"
        try:
            return int(acct.read_text()) / 1e9
        except (FileNotFoundError, ValueError):
            return float("nan")

    def throttled_seconds(self) -> float:
        """How long the group's processes were held back by the quota (``cpu.stat`` throttled_time)."""
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
        return float("nan")

    def close(self) -> None:
        """Moves remaining processes back to the root group and removes the group (idempotent)."""
        if not self.path.exists():
            return
        for _ in range(50):
            for pid in self.pids():
                try:
                    (CPU_ROOT / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    pass  # it exited since pids() read it: nothing left to move out
            try:
                self.path.rmdir()
                return
            except OSError:  # a process forked in between, or one still exiting
                time.sleep(0.02)
        self.path.rmdir()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _own_cpu_group() -> Path:
    """This process's cgroup v1 cpu directory (from /proc/self/cgroup, e.g. ``4:cpu:/``)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return CPU_ROOT / path.lstrip("/")
    return CPU_ROOT


def worker_pids(launcher_pid: int) -> dict[str, int]:
    """``{"host:port": pid}`` of the live worker processes under ``launcher_pid`` (by their KUNGFU_SELF)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found: dict[str, int] = {}
    stack = list(children.get(launcher_pid, []))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for item in env:
            if item.startswith(b"KUNGFU_SELF="):
                peer = item.split(b"=", 1)[1].decode()
                if peer not in found or pid < found[peer]:
                    found[peer] = pid  # the worker itself, not a helper it forked
    return found
