"""Jobs started without kungfu-run: real ``mpirun`` (Open MPI), and srun's environment.

Every job runs tests/workers/external_launch.py, which checks its rank and
size against the launcher's own numbers and its collectives and
SynchronousSGD steps against numpy. Open MPI is a system package that
``make sysdeps`` installs (CI is root with apt), so a missing ``mpirun``
fails the tests rather than skipping them. There is no Slurm here: srun's
tasks are two processes started with the variables srun would give them.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, describe, finish_job, worker_env, worker_path

# The alternative these bounds rule out is a collective waiting for a dead
# peer until its deadline: KUNGFU_TIMEOUT is set to 600 s, far above them.
JOB_TIMEOUT_S = 150
DETECTION_BOUND_S = 10
# "[1,2]<stdout>:text": mpirun --tag-output (job 1, rank 2).
TAGGED_LINE = re.compile(r"^\[\d+,(\d+)\]<std(?:out|err)>:(.*)$")


def mpirun_env(**extra: str) -> dict[str, str]:
    # Root (CI) needs both variables; harmless otherwise. No PYTHONUNBUFFERED:
    # unbuffered, print() writes a line's text and its newline separately, and
    # --tag-output then tags the lone newline too ("text[1,0]<stdout>:");
    # the workers flush whole lines themselves.
    env = worker_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", KUNGFU_TIMEOUT="600", **extra)
    env.pop("PYTHONUNBUFFERED", None)
    return env


def run_mpirun(np: int, argv: list[str], *, mca: tuple[str, ...] = (), env: dict[str, str] | None = None,
               ) -> tuple[int, str, str]:
    """``mpirun -np N --oversubscribe --tag-output ARGV`` in its own session (killed on timeout)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.fail("mpirun is missing: install Open MPI (make sysdeps installs openmpi-bin)")
    proc = subprocess.Popen(
        [mpirun, "-np", str(np), "--oversubscribe", "--tag-output", *mca, *argv],
        cwd=REPO_ROOT, env=env or mpirun_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    return finish_job(proc, JOB_TIMEOUT_S)


def tagged_lines(out: str) -> dict[int, list[str]]:
    """Output lines by rank, from mpirun's --tag-output prefixes."""
    lines: dict[int, list[str]] = {}
    for line in out.splitlines():
        m = TAGGED_LINE.match(line)
        if m:
            lines.setdefault(int(m.group(1)), []).append(m.group(2))
    return lines


def free_port_pair() -> int:
    """A port P with P and P + 1 both free now (a base for two local ranks)."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            if port == 65535:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise AssertionError("no two consecutive free ports found")


def test_mpirun_three_ranks_form_one_job_and_train_like_numpy():
    rc, out, err = run_mpirun(3, [sys.executable, worker_path("external_launch.py"), "check"])
    assert rc == 0, describe(rc, out, err)
    lines = tagged_lines(out)
    last = {r: lines.get(r, ["(nothing)"])[-1] for r in range(3)}
    assert last == dict.fromkeys(range(3), "checked 7 results"), describe(rc, out, err)


def test_mpirun_rank_killed_the_others_fail_fast_naming_it():
    # odls_base_sigkill_timeout 3: mpirun SIGKILLs the survivors (which
    # ignore its SIGTERM) 3 s after it notices the death, so a survivor that
    # missed the loss shows as a missing "PEER LOST" line, not as a hang.
    rc, out, err = run_mpirun(3, [sys.executable, worker_path("external_launch.py"), "die"],
                              mca=("--mca", "odls_base_sigkill_timeout", "3"))
    assert rc != 0, describe(rc, out, err)
    lines = tagged_lines(out)
    killed = [float(m.group(1)) for line in lines.get(1, []) if (m := re.match(r"rank 1 kills itself at (\S+)", line))]
    assert killed, describe(rc, out, err)
    for rank in (0, 2):
        lost = [m for line in lines.get(rank, []) if (m := re.match(r"PEER LOST at (\S+) on rank \d+: (.*)", line))]
        assert lost, f"rank {rank} did not report the lost peer\n" + describe(rc, out, err)
        assert re.search(r"lost connection from rank 1 \(127\.0\.0\.1:\d+\)", lost[0].group(2)), lost[0].group(2)
        delay = float(lost[0].group(1)) - killed[0]
        assert delay < DETECTION_BOUND_S, f"rank {rank} noticed the death after {delay:.1f} s"
    assert "rank 1" in out + err and "signal 9" in out + err, describe(rc, out, err)


def test_mpirun_taken_port_names_the_port_and_the_override():
    base = free_port_pair()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 1))
        holder.listen()
        rc, out, err = run_mpirun(
            2, [sys.executable, "-c", "import kungfu_tf; print('size', kungfu_tf.size())"],
            env=mpirun_env(KUNGFU_PORT_BASE=str(base)),
        )
    assert rc != 0, describe(rc, out, err)
    assert re.search(
        rf"ExternalLaunchError: port {base + 1}, where Open MPI rank 1 \(local rank 1\) must listen, is in use "
        rf"on this host \(port base {base}, KUNGFU_PORT_BASE={base};.*set KUNGFU_PORT_BASE", out + err
    ), describe(rc, out, err)


def test_srun_environment_forms_a_job_of_two_processes():
    base = free_port_pair()
    procs = []
    for rank in range(2):
        env = worker_env(
            SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_LOCALID=str(rank), SLURM_STEP_NODELIST="node07",
            SLURM_STEP_TASKS_PER_NODE="2", SLURM_JOB_ID="915", SLURM_STEP_ID="0", SLURM_DISTRIBUTION="block",
            KUNGFU_JOB_SECRET="5e" * 32, KUNGFU_PORT_BASE=str(base), KUNGFU_TIMEOUT="600", PYTHONUNBUFFERED="1",
        )
        procs.append(subprocess.Popen(
            [sys.executable, worker_path("external_launch.py"), "check"], cwd=REPO_ROOT, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        ))
    results = [finish_job(p, JOB_TIMEOUT_S) for p in procs]
    for rc, out, err in results:
        assert rc == 0 and out.splitlines()[-1:] == ["checked 7 results"], describe(rc, out, err)
