"""How much CPU other processes took while the benchmark ran.

On a small shared machine the numbers are only meaningful if nothing else
was running; the load average alone cannot tell our own workers apart from
foreign load, so this compares the machine's busy CPU time (/proc/stat)
with the CPU time of this process and its waited-for children.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass


def _machine_busy_s() -> float | None:
    """Non-idle CPU seconds of all cores since boot (Linux), else None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process plus all children it has waited for.

    Grandchildren (workers under kungfu-run) count too, because the
    launcher waits for them before it is waited for itself.
    """
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        ru = resource.getrusage(who)
        total += ru.ru_utime + ru.ru_stime
    return total


@dataclass
class CpuMeter:
    """Started at construction; ``foreign()`` reads the interval so far."""

    busy0: float | None = None
    own0: float = 0.0

    def __post_init__(self) -> None:
        """Takes the starting snapshot."""
        self.busy0 = _machine_busy_s()
        self.own0 = _own_cpu_s()

    def foreign(self, wall_s: float) -> float | None:
        """Average number of cores used by other processes over ``wall_s``.

        Only accurate once all children have been waited for.
        """
        busy1 = _machine_busy_s()
        if self.busy0 is None or busy1 is None or wall_s <= 0:
            return None
        other = (busy1 - self.busy0) - (_own_cpu_s() - self.own0)
        return max(0.0, other / wall_s)
