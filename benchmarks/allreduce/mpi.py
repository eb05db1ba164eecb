"""Open MPI's ``MPI_Allreduce``, the benchmark's second anchor: build and launch.

``benchmarks/allreduce/mpi_allreduce.c`` is compiled here with ``mpicc`` and started with
``mpirun`` on loopback only. Open MPI comes from Debian's ``openmpi-bin`` and
``libopenmpi-dev``, which ``make sysdeps`` installs.

Example:
    >>> from pathlib import Path
    >>> argv = mpirun_argv(2, Path("build/bench/mpi_allreduce"), ["verify", "in", "out"])
    >>> argv[argv.index("-np") + 1], argv[-3:]
    ('2', ['verify', 'in', 'out'])
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "mpi_allreduce.c"
# Short: it ends up in every cell of the table's MPI column.
INSTALL_HINT = "`make sysdeps` installs it"

# Loopback only. Ranks of one host talk through shared memory (vader); TCP
# is allowed on lo alone, and so is mpirun's own out-of-band channel. ob1
# keeps UCX out (it probes every network device it finds), and UCX's
# one-sided component is excluded for the same reason.
LOOPBACK_MCA: dict[str, str] = {
    "btl": "self,vader,tcp",
    "btl_tcp_if_include": "lo",
    "oob_tcp_if_include": "lo",
    "pml": "ob1",
    "osc": "^ucx",
    # Waiting ranks yield the CPU between polls, as Open MPI does by itself
    # when np > cores. Without it, at np = cores on a machine where anything
    # else runs, a rank spins away a whole time slice while its peer waits
    # for a core: on the 2-core CI machine under load, 4 B at np=2 measured
    # 0.5 µs or 10 ms from one run to the next, and 1-10 µs with yielding.
    "mpi_yield_when_idle": "1",
}


class MpiMissing(RuntimeError):
    """``mpicc`` or ``mpirun`` is not installed (the message says which)."""


def missing_tool() -> str | None:
    """Why Open MPI cannot be used here, or None if both tools are found."""
    for tool in ("mpicc", "mpirun"):
        if shutil.which(tool) is None:
            return f"{tool} not found ({INSTALL_HINT})"
    return None


def build(build_dir: Path) -> Path:
    """Compiles benchmarks/allreduce/mpi_allreduce.c into ``build_dir`` and returns the program.

    Raises MpiMissing if Open MPI is not installed, and
    subprocess.CalledProcessError (with the compiler's output) if it does
    not compile.
    """
    reason = missing_tool()
    if reason is not None:
        raise MpiMissing(reason)
    build_dir.mkdir(parents=True, exist_ok=True)
    exe = build_dir / "mpi_allreduce"
    cmd = ["mpicc", "-O2", "-Wall", "-Wextra", "-o", str(exe), str(SOURCE)]
    subprocess.run(cmd, check=True, timeout=120, capture_output=True, text=True)
    return exe


def mpirun_argv(np: int, exe: Path, args: list[str]) -> list[str]:
    """``mpirun`` starting ``np`` ranks of ``exe args`` on this host, loopback only.

    --allow-run-as-root: CI runs as root. --oversubscribe: np may exceed the
    cores. --bind-to none: the ranks float like every other contender's
    workers (Open MPI would pin them to cores when np <= cores).
    """
    if np < 1:
        raise ValueError(f"np must be at least 1, got {np}")
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np)]
    argv += ["--bind-to", "none"]
    for name, value in LOOPBACK_MCA.items():
        argv += ["--mca", name, value]
    return [*argv, str(exe), *args]
