"""All-reduce benchmark: kungfu_tf vs TensorFlow MWMS vs the raw transport.

One run measures, on loopback only:
  * kungfu_tf's all-reduce in a tf.function for every topology
    (one ``kungfu-run`` launch per np, see benchmarks/allreduce/worker_kungfu.py);
  * TensorFlow's MultiWorkerMirroredStrategy collective all-reduce (RING,
    gRPC) at the same np and sizes (benchmarks/allreduce/worker_mwms.py);
  * Open MPI's MPI_Allreduce at the same np and sizes, a second anchor
    (benchmarks/allreduce/mpi_allreduce.c, compiled here with mpicc, see benchmarks/allreduce/mpi.py);
  * the raw TCP and Unix socket limits (benchmarks/allreduce/raw_transport.c, compiled here)
    and the raw shared-memory limit: memcpy bandwidth, streaming and ping-pong
    through the runtime's ring (benchmarks/allreduce/raw_shm.cc, compiled here);
  * the same all-reduce through the C++ runtime alone, without TensorFlow
    (benchmarks/allreduce/runtime_allreduce.cc, compiled here), to separate runtime cost from TF
    op dispatch, over shared memory and over Unix sockets (KUNGFU_SHM=0);
  * with part "socket", AUTO in a tf.function once more over Unix sockets
    (KUNGFU_SHM=0), so the shared-memory transport's gain is a ratio within
    the run;
then prints markdown tables plus the issue's targets check and writes the
raw results as JSON.

    .venv/bin/python -m benchmarks.allreduce                 # full, ~5-10 min
    .venv/bin/python -m benchmarks.allreduce --quick         # smoke run
    .venv/bin/python -m benchmarks.allreduce --only mwms,raw --sizes 4,1M
    .venv/bin/python -m benchmarks.allreduce --only kungfu,mpi --topologies AUTO
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.allreduce import mpi as bench_mpi
from benchmarks.allreduce.report import (
    allreduce_tables,
    auto_table,
    raw_table,
    runtime_table,
    shm_targets_table,
    targets_table,
)
from benchmarks.allreduce.targets import evaluate, evaluate_auto, evaluate_shm
from benchmarks.harness.load import CpuMeter
from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.proc import LOOPBACK, free_ports, log, run_group, worker_env
from benchmarks.harness.timing import MAX_ITERS, WARMUP_CALLS, Timing, parse_results
from benchmarks.harness.units import format_rate, format_size, format_time, parse_size

EXP_DIR = Path(__file__).resolve().parent
BENCH_DIR = EXP_DIR.parent
REPO = BENCH_DIR.parent
BUILD_DIR = REPO / "build" / "bench"

TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE", "AUTO")
PARTS = ("raw", "runtime", "kungfu", "socket", "mwms", "mpi")
# Same-host transports of the runtime: shared-memory rings (the default)
# and Unix sockets, forced by KUNGFU_SHM=0.
RUNTIME_TRANSPORTS = {"shm": "1", "unix": "0"}
DEFAULT_SIZES = "4,1K,64K,1M,16M,64M"
QUICK_SIZES = "4,64K,1M"
RAW_MESSAGE = 64 << 20  # the exchange message size the targets refer to

# Above this many cores used by other processes, a phase gets a warning.
FOREIGN_WARN_CORES = 0.2

T = TypeVar("T")



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line; --quick only changes defaults the user did not set."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--np", help="comma-separated worker counts (default 2,4)")
    p.add_argument(
        "--sizes",
        help=f"comma-separated float32 tensor sizes (default {DEFAULT_SIZES})",
    )
    p.add_argument(
        "--topologies",
        default=",".join(TOPOLOGIES),
        help="kungfu_tf topologies to measure (default: all)",
    )
    p.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"subset of {','.join(PARTS)} to run (default: all)",
    )
    p.add_argument("--quick", action="store_true", help="fast smoke run")
    p.add_argument(
        "--prebuilt",
        action="store_true",
        help="use the programs already in build/bench instead of compiling them "
        "(for a host with no compiler or no mpicc: build here, run there)",
    )
    p.add_argument("--repeats", type=int, help="timed loops per point (default 7)")
    p.add_argument(
        "--rounds",
        type=int,
        help="our all-reduce in a tf.function: rounds over the topologies in rotated orders, "
        "--repeats spread over them (default 3; --quick 1)",
    )
    p.add_argument(
        "--target-seconds", type=float, help="duration of one timed loop (default 0.25)"
    )
    p.add_argument(
        "--raw-seconds", type=float, help="duration of each raw exchange (default 3)"
    )
    p.add_argument(
        "--launch-timeout",
        type=float,
        default=900.0,
        help="kill a worker group after this many seconds (default 900)",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=BUILD_DIR / "allreduce.json",
        help="where to write the raw results (default build/bench/allreduce.json)",
    )
    args = p.parse_args(argv)

    quick = args.quick
    try:
        args.np = [int(v) for v in (args.np or "2,4").split(",")]
        sizes = args.sizes or (QUICK_SIZES if quick else DEFAULT_SIZES)
        args.sizes = [parse_size(v) for v in sizes.split(",")]
    except ValueError as e:
        p.error(str(e))
    if args.repeats is None:
        args.repeats = 3 if quick else 7
    if args.rounds is None:
        args.rounds = 1 if quick else 3
    if args.rounds < 1 or args.repeats < 1:
        p.error("--rounds and --repeats must be at least 1")
    if args.target_seconds is None:
        args.target_seconds = 0.05 if quick else 0.25
    if args.raw_seconds is None:
        args.raw_seconds = 0.5 if quick else 3.0
    args.pingpong_iters = 2000 if quick else 20000
    args.topologies = [t.strip().upper() for t in args.topologies.split(",")]
    args.only = [v.strip() for v in args.only.split(",")]

    for part in args.only:
        if part not in PARTS:
            p.error(f"--only: unknown part {part!r}; choose from {','.join(PARTS)}")
    for t in args.topologies:
        if t not in TOPOLOGIES:
            p.error(f"--topologies: unknown {t!r}; choose from {','.join(TOPOLOGIES)}")
    if any(n < 1 for n in args.np):
        p.error("--np: worker counts must be at least 1")
    for s in args.sizes:
        if s < 4 or s % 4:
            p.error(f"--sizes: {s} is not a positive multiple of 4 (float32)")
    return args


def log_point(r: dict[str, Any]) -> None:
    """One measured all-reduce point in readable form."""
    log(
        f"  {r['impl']} {r['topology']} np={r['np']} "
        f"{format_size(r['size'])}: {format_time(r['median_s'])} "
        f"(x{r['iters']})"
    )


def progress(line: str) -> None:
    """Echoes a worker's result line in readable form as soon as it arrives."""
    for r in parse_results([line]):
        if "median_s" in r:
            log_point(r)


# ----------------------------------------------------------------- helpers


def timing_args(args: argparse.Namespace) -> list[str]:
    """Timing options shared by every TF measurement script."""
    return [
        "--repeats",
        str(args.repeats),
        "--target-seconds",
        str(args.target_seconds),
    ]


def worker_args(args: argparse.Namespace) -> list[str]:
    """Measurement options shared by both all-reduce worker kinds."""
    return ["--sizes", ",".join(str(s) for s in args.sizes), *timing_args(args)]


# ----------------------------------------------------------------- raw


def run_raw(args: argparse.Namespace, errors: list[str]) -> dict[str, Any]:
    """Compiles benchmarks/allreduce/raw_transport.c and measures TCP and Unix socket limits."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    exe = str(BUILD_DIR / "raw_transport")
    cmd = ["cc", "-O2", "-pthread", "-o", exe, str(EXP_DIR / "raw_transport.c")]
    if args.prebuilt:
        if prebuilt_program("raw_transport", errors) is None:
            return {}
    else:
        log("compiling " + " ".join(cmd))
        try:
            subprocess.run(cmd, check=True, timeout=120)
        except (subprocess.SubprocessError, OSError) as e:
            errors.append(f"raw: compile failed: {e}")
            return {}

    # Ping-pong on two different CPUs is the reference for the targets: it
    # is where concurrently running workers are, and on a VM the cross-vCPU
    # wake-up dominates a 4-byte round trip. Same-CPU is shown for contrast.
    # Unpinned runs flip between the two from one run to the next.
    two_cpus = len(os.sched_getaffinity(0)) >= 2
    placements = (
        {"pingpong": "split", "pingpong_same_cpu": "same"}
        if two_cpus
        else {"pingpong": "any"}
    )
    raw: dict[str, Any] = {}
    for transport in ("tcp", "unix"):
        size, secs = str(RAW_MESSAGE), str(args.raw_seconds)
        runs = {"exchange": [exe, "exchange", transport, size, secs]}
        for mode, placement in placements.items():
            iters = str(args.pingpong_iters)
            runs[mode] = [exe, "pingpong", transport, iters, placement]
        for mode, argv in runs.items():
            timeout = 60 + 4 * args.raw_seconds
            (res,) = run_group([argv], [worker_env()], timeout_s=timeout)
            found = parse_results(res.lines)
            if not res.ok or not found:
                errors.append(f"raw {transport} {mode} failed:\n{res.tail()}")
                continue
            rec = raw.setdefault(transport, {})[mode] = found[0]
            if mode == "exchange":
                rate = format_rate(rec["bytes_per_s_each_way"])
                log(f"raw {transport} exchange: {rate} each way")
            else:
                rtt = format_time(rec["rtt_median_s"])
                log(f"raw {transport} ping-pong RTT ({rec['placement']}): {rtt}")
    shm = run_raw_shm(args, placements, errors)
    if shm:
        raw["shm"] = shm
    return raw


def prebuilt_program(name: str, errors: list[str]) -> str | None:
    """build/bench/<name> as an earlier run compiled it (--prebuilt), or None and an error."""
    exe = BUILD_DIR / name
    if not os.access(exe, os.X_OK):
        errors.append(f"{name}: --prebuilt but {exe.relative_to(REPO)} is missing or not executable")
        return None
    return str(exe)


def compile_with_runtime(name: str, errors: list[str], prebuilt: bool = False) -> str | None:
    """Compiles benchmarks/allreduce/<name>.cc with the runtime; the program's path.

    With ``prebuilt`` the program an earlier run compiled is used as it is.

    The runtime comes from the C++ tests' objects (build/cpp/obj, -O2, built
    by make only where a source changed): compiling every source again in
    one g++ call took over 5 minutes on the loaded 2-core machine.
    """
    if prebuilt:
        return prebuilt_program(name, errors)
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    exe = str(BUILD_DIR / name)
    sources = sorted((REPO / "ops" / "runtime").glob("*.cc"))
    objects = [f"build/cpp/obj/{p.stem}.o" for p in sources]
    cmd = ["g++", "-std=c++17", "-O2", "-pthread", "-I", str(REPO / "ops" / "runtime")]
    cmd += ["-o", exe, str(EXP_DIR / f"{name}.cc"), *objects, "-lcrypto"]
    log(f"compiling benchmarks/allreduce/{name}.cc")
    try:
        subprocess.run(["make", "-s", *objects], check=True, timeout=1800, cwd=REPO)
        subprocess.run(cmd, check=True, timeout=300, cwd=REPO)
    except (subprocess.SubprocessError, OSError) as e:
        errors.append(f"{name}: compile failed: {e}")
        return None
    return exe


def run_raw_shm(
    args: argparse.Namespace, placements: dict[str, str], errors: list[str]
) -> dict[str, Any]:
    """The raw shared-memory limit: memcpy, and the ring alone (raw_shm.cc)."""
    exe = compile_with_runtime("raw_shm", errors, args.prebuilt)
    if exe is None:
        return {}
    secs = str(args.raw_seconds)
    runs = {
        "memcpy": [exe, "memcpy", str(RAW_MESSAGE), secs],
        "exchange": [exe, "exchange", str(RAW_MESSAGE), secs],
    }
    for mode, placement in placements.items():
        runs[mode] = [exe, "pingpong", str(args.pingpong_iters), placement]
    shm: dict[str, Any] = {}
    for mode, argv in runs.items():
        (res,) = run_group([argv], [worker_env()], timeout_s=60 + 4 * args.raw_seconds)
        found = parse_results(res.lines)
        if not res.ok or not found:
            errors.append(f"raw shm {mode} failed:\n{res.tail()}")
            continue
        rec = shm[mode] = found[0]
        if mode == "memcpy":
            log(f"raw memcpy: {format_rate(rec['bytes_per_s'])}")
        elif mode == "exchange":
            log(f"raw shm exchange: {format_rate(rec['bytes_per_s_each_way'])} each way")
        else:
            log(f"raw shm ping-pong RTT ({rec['placement']}): {format_time(rec['rtt_median_s'])}")
    return shm


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One runtime point from its rounds: every round's loops, their median, the choices seen.

    Example:
        >>> merge_rounds([{"samples": [3.0, 1.0], "auto_choice": "STAR", "timed_calls": 10},
        ...               {"samples": [2.0], "auto_choice": "STAR", "timed_calls": 5}])["median_s"]
        2.0
    """
    point = dict(runs[-1])
    point["samples"] = [t for run in runs for t in run["samples"]]
    point["median_s"] = statistics.median(point["samples"])
    point["rounds"] = len(runs)
    for key in ("timed_calls", "polled_frames", "calls_held_for_sample"):
        if all(key in run for run in runs):
            point[key] = sum(run[key] for run in runs)
    choices = sorted({run.get("auto_choice", "") for run in runs} - {""})
    point["auto_choice"] = "/".join(choices)  # each round is a new job: its own probe
    return point


def run_runtime(args: argparse.Namespace, errors: list[str]) -> list[dict[str, Any]]:
    """Compiles benchmarks/allreduce/runtime_allreduce.cc with the runtime sources and times it.

    Every point twice, shared memory then Unix sockets (KUNGFU_SHM=0), one
    right after the other so that the ratio sees the same machine load.
    """
    exe = compile_with_runtime("runtime_allreduce", errors, args.prebuilt)
    if exe is None:
        return []
    per_round = str(-(-args.repeats // args.rounds))
    points: list[dict[str, Any]] = []
    for n in args.np:
        for size in args.sizes:
            # As in the tf.function part: rounds over the topologies in rotated orders.
            found_by: dict[tuple[str, str], list[dict[str, Any]]] = {}
            topologies = list(args.topologies)
            for r in range(args.rounds):
                k = r % len(topologies)
                for topology in topologies[k:] + topologies[:k]:
                    for transport, shm in RUNTIME_TRANSPORTS.items():
                        iters = "1000" if size <= 1024 else "5"
                        argv = [exe, str(n), topology, str(size), iters, per_round]
                        # One name for every call, as a training step's gradient: AUTO's probe
                        # samples after each call of a name but its first, so with a new name
                        # per call it would never run and AUTO would stay on its prediction.
                        # "settled": AUTO is timed once every worker holds its choice.
                        argv.append("settled")
                        env = worker_env({"KUNGFU_SHM": shm})
                        (res,) = run_group([argv], [env], timeout_s=300)
                        found = parse_results(res.lines)
                        if not res.ok or not found:
                            errors.append(
                                f"runtime np={n} {topology} {size} B {transport} failed:\n{res.tail()}"
                            )
                            continue
                        found_by.setdefault((topology, transport), []).append(found[0])
            for (topology, transport), runs in found_by.items():
                point = merge_rounds(runs)
                points.append(point)
                log(
                    f"  runtime {topology} np={n} {format_size(size)} {transport}: "
                    f"{format_time(point['median_s'])}"
                    + (f" ({point['auto_choice']})" if point.get("auto_choice") else "")
                )
    return points


def run_floor(args: argparse.Namespace, errors: list[str]) -> dict[str, Any] | None:
    """Time of a tf.function that communicates nothing (benchmarks/allreduce/dispatch_floor.py)."""
    argv = [sys.executable, str(EXP_DIR / "dispatch_floor.py"), *timing_args(args)]
    (res,) = run_group([argv], [worker_env()], timeout_s=300, cwd=str(REPO))
    found = parse_results(res.lines)
    if not res.ok or not found:
        errors.append(f"dispatch floor failed:\n{res.tail()}")
        return None
    log(f"tf.function dispatch floor: {format_time(found[0]['median_s'])}")
    return found[0]


# ----------------------------------------------------------------- kungfu


def kungfu_importable(errors: list[str]) -> bool:
    """True if the built op library loads; explains why not otherwise."""
    # Touch the contract's names: an empty kungfu_tf/ops/ directory would
    # import fine as a namespace package.
    code = (
        "import kungfu_tf; from kungfu_tf import ops as kf; "
        "kf.all_reduce, kf.set_topology, kf.barrier, kungfu_tf.rank, kungfu_tf.size"
    )
    probe = [sys.executable, "-c", code]
    (res,) = run_group([probe], [worker_env()], timeout_s=180, cwd=str(REPO))
    if not res.ok:
        errors.append(
            "kungfu: kungfu_tf ops API not available (run `make install`):\n"
            + res.tail(8)
        )
    return res.ok


def run_kungfu(
    n: int,
    args: argparse.Namespace,
    errors: list[str],
    topologies: list[str] | None = None,
    over_sockets: bool = False,
) -> list[dict[str, Any]]:
    """One kungfu-run launch measuring every topology and size at np=n.

    ``over_sockets``: with KUNGFU_SHM=0 (same-host peers talk through Unix
    sockets); its points are labelled impl "kungfu_unix".
    """
    topologies = topologies or args.topologies
    argv = [
        sys.executable,
        "-m",
        "kungfu_tf.run",
        "-np",
        str(n),
        sys.executable,
        str(EXP_DIR / "worker_kungfu.py"),
        *worker_args(args),
        # The repeats spread over the rounds (argparse keeps the last --repeats).
        "--repeats",
        str(-(-args.repeats // args.rounds)),
        "--rounds",
        str(args.rounds),
        "--topologies",
        ",".join(topologies),
    ]
    log(f"kungfu np={n}{' over Unix sockets' if over_sockets else ''}: {' '.join(argv[2:5])} ...")
    env = worker_env({"KUNGFU_SHM": "0"} if over_sockets else None)
    (res,) = run_group(
        [argv],
        [env],
        timeout_s=args.launch_timeout,
        on_line=lambda _i, line: progress(line),
        cwd=str(REPO),
    )
    if not res.ok:
        errors.append(f"kungfu np={n}: exit status {res.returncode}:\n{res.tail()}")
    points = parse_results(res.lines)
    if over_sockets:
        for p in points:
            p["impl"] = p["impl"].replace("kungfu", "kungfu_unix", 1)
    return points


# ----------------------------------------------------------------- MWMS


def run_mwms(
    n: int, args: argparse.Namespace, errors: list[str]
) -> list[dict[str, Any]]:
    """N plain TF processes forming a MultiWorkerMirroredStrategy cluster."""
    workers = [f"{LOOPBACK}:{port}" for port in free_ports(n)]
    envs = []
    for i in range(n):
        tf_config = {
            "cluster": {"worker": workers},
            "task": {"type": "worker", "index": i},
        }
        envs.append(worker_env({"TF_CONFIG": json.dumps(tf_config)}))
    argv = [
        sys.executable,
        str(EXP_DIR / "worker_mwms.py"),
        *worker_args(args),
    ]
    log(f"mwms np={n}: {', '.join(workers)}")
    results = run_group(
        [argv] * n,
        envs,
        timeout_s=args.launch_timeout,
        on_line=lambda i, line: progress(line) if i == 0 else None,
        cwd=str(REPO),
    )
    for i, res in enumerate(results):
        if not res.ok:
            errors.append(
                f"mwms np={n} worker {i}: exit status {res.returncode}:\n{res.tail()}"
            )
    return parse_results(results[0].lines)


# ----------------------------------------------------------------- Open MPI


def build_mpi(errors: list[str], prebuilt: bool = False) -> tuple[Path | None, str | None]:
    """(program, None) or (None, why the MPI column stays empty).

    A missing Open MPI is not an error of the run (the rest is measured and
    the table says why the column is empty); a compile failure is. With
    ``prebuilt`` only ``mpirun`` is needed: the program is an earlier build's.
    """
    if prebuilt:
        if shutil.which("mpirun") is None:
            log(f"mpi: mpirun not found ({bench_mpi.INSTALL_HINT})")
            return None, f"mpirun not found ({bench_mpi.INSTALL_HINT})"
        exe = prebuilt_program("mpi_allreduce", errors)
        return (Path(exe), None) if exe else (None, "no prebuilt program")
    try:
        exe = bench_mpi.build(BUILD_DIR)
    except bench_mpi.MpiMissing as e:
        log(f"mpi: {e}")
        return None, str(e)
    except subprocess.CalledProcessError as e:
        errors.append(f"mpi: compile failed:\n{e.stderr}")
        return None, "compile failed"
    except (subprocess.SubprocessError, OSError) as e:
        errors.append(f"mpi: compile failed: {e}")
        return None, "compile failed"
    log(f"compiled {exe.relative_to(REPO)} with mpicc")
    return exe, None


def run_mpi(
    n: int, exe: Path, args: argparse.Namespace, errors: list[str]
) -> list[dict[str, Any]]:
    """MPI_Allreduce at np=n over every size, timed as the TF workers time."""
    timing = [str(args.repeats), str(args.target_seconds), str(MAX_ITERS)]
    sizes = ",".join(str(s) for s in args.sizes)
    argv = bench_mpi.mpirun_argv(n, exe, ["time", sizes, *timing, str(WARMUP_CALLS)])
    log(f"mpi np={n}: mpirun ... {exe.name}")
    (res,) = run_group(
        [argv], [worker_env()], timeout_s=args.launch_timeout, cwd=str(REPO)
    )
    if not res.ok:
        errors.append(f"mpi np={n}: exit status {res.returncode}:\n{res.tail()}")
    points = parse_results(res.lines)
    for rec in points:
        # The C program reports the samples; the median is bench_timing's.
        rec["median_s"] = Timing(rec["iters"], rec["samples_s"]).median_s
        log_point(rec)
    return points


# ----------------------------------------------------------------- main


def add_bandwidth(point: dict[str, Any]) -> dict[str, Any]:
    """Adds algbw = bytes / time and busbw = algbw * 2(n-1)/n (as nccl-tests).

    busbw is what each link has to carry in an optimal ring all-reduce, so
    it is directly comparable to the raw per-direction link rate.
    """
    n, t = point["np"], point["median_s"]
    point["algbw"] = point["size"] / t
    point["busbw"] = point["algbw"] * 2 * (n - 1) / n
    return point


def metadata(args: argparse.Namespace) -> dict[str, Any]:
    """Where and how the numbers were taken."""
    return {
        **machine_metadata(),
        "np": args.np,
        "sizes": args.sizes,
        "topologies": args.topologies,
        "repeats": args.repeats,
        "target_seconds": args.target_seconds,
        "raw_seconds": args.raw_seconds,
    }


class Phases:
    """Runs the benchmark phases, recording foreign CPU load during each."""

    def __init__(self) -> None:
        """No phase run yet."""
        self.foreign_cores: dict[str, float | None] = {}

    def run(self, name: str, fn: Callable[[], T]) -> T:
        """Runs ``fn`` as phase ``name``."""
        meter, t0 = CpuMeter(), time.monotonic()
        try:
            return fn()
        finally:
            busy = meter.foreign(time.monotonic() - t0)
            self.foreign_cores[name] = busy
            if busy is not None and busy > FOREIGN_WARN_CORES:
                log(f"warning: other processes used {busy:.2f} cores during {name}")


@dataclass
class Measured:
    """Everything one run measured."""

    raw: dict[str, Any]  # transport limits, dispatch floor, runtime alone
    points: list[dict[str, Any]]  # all-reduce points of every implementation
    have_kungfu: bool  # the op library loaded, so kungfu points were taken
    mpi_note: str | None  # why Open MPI was not measured (None: it was, or not asked)


def measure_all(
    args: argparse.Namespace, errors: list[str], phases: Phases
) -> Measured:
    """Runs every selected part."""
    raw: dict[str, Any] = {}
    if "raw" in args.only:
        raw = phases.run("raw", lambda: run_raw(args, errors))
        # A host without TensorFlow (the 16-core one: --prebuilt) measures
        # the rest; its report says the floor was not measured.
        floor = None
        if importlib.util.find_spec("tensorflow") is None:
            log("tf.function dispatch floor: not measured (TensorFlow is not installed)")
        else:
            floor = phases.run("floor", lambda: run_floor(args, errors))
        if floor is not None:
            raw["tf_function_floor"] = floor
    if "runtime" in args.only:
        raw["runtime"] = phases.run("runtime", lambda: run_runtime(args, errors))
    have_kungfu = (
        "kungfu" in args.only or "socket" in args.only
    ) and kungfu_importable(errors)
    mpi_exe, mpi_note = build_mpi(errors, args.prebuilt) if "mpi" in args.only else (None, None)
    points: list[dict[str, Any]] = []
    for n in args.np:
        if have_kungfu and "kungfu" in args.only:
            points += phases.run(
                f"kungfu np={n}", lambda n=n: run_kungfu(n, args, errors)
            )
        if have_kungfu and "socket" in args.only and "AUTO" in args.topologies:
            points += phases.run(
                f"kungfu np={n} over Unix sockets",
                lambda n=n: run_kungfu(n, args, errors, ["AUTO"], over_sockets=True),
            )
        if "mwms" in args.only:
            points += phases.run(f"mwms np={n}", lambda n=n: run_mwms(n, args, errors))
        if mpi_exe is not None:
            points += phases.run(
                f"mpi np={n}", lambda n=n: run_mpi(n, mpi_exe, args, errors)
            )
    points = [add_bandwidth(p) for p in points]
    return Measured(raw, points, have_kungfu, mpi_note)


def print_report(
    args: argparse.Namespace,
    meta: dict[str, Any],
    measured: Measured,
    evals: list[dict[str, Any]],
) -> None:
    """The markdown report on stdout."""
    raw = measured.raw
    topologies = args.topologies if measured.have_kungfu else []
    with_mpi = "mpi" in args.only
    print("### All-reduce (float32 sum)\n")
    print(
        allreduce_tables(
            measured.points,
            args.np,
            args.sizes,
            topologies,
            "mwms" in args.only,
            with_mpi,
            measured.mpi_note,
        )
    )
    print(
        "\nbus bandwidth = bytes / time · 2(n−1)/n; time = median over "
        f"{args.repeats} timed loops, each a tf.function call repeated "
        "until ~"
        + format_time(args.target_seconds)
        + "."
        + (
            f" Ours: {args.rounds} rounds over the topologies, each size's in a rotated order, "
            f"{-(-args.repeats // args.rounds)} loops per point and round; AUTO is timed once every "
            "worker holds its choice (in parentheses)."
            if args.rounds > 1
            else ""
        )
    )
    if with_mpi:
        print(
            "Open MPI: the same protocol with plain MPI_Allreduce calls from C "
            "(mpirun, shared memory between the ranks, ranks not pinned); "
            "AUTO ÷ MPI > 1 means ours takes longer."
        )
    print()
    if raw.get("runtime"):
        print("### The runtime alone (C++, no TensorFlow)\n")
        print(runtime_table(raw["runtime"], args.np, args.topologies) + "\n")
        print(
            "shm: same-host peers exchange frames through shared-memory rings "
            "(the default); unix: through Unix sockets (KUNGFU_SHM=0). Each "
            "pair of rows ran back to back.\n"
        )
    if raw.get("tcp") or raw.get("unix") or raw.get("shm"):
        print("### Raw transport limit (this machine, loopback)\n")
        print(raw_table(raw) + "\n")
    print("### Targets\n")
    print(targets_table(evals) + "\n")
    auto_evals = evaluate_auto(measured.points, raw)
    if auto_evals:
        print("### AUTO against the best fixed topology (issue 23 §2)\n")
        print(auto_table(auto_evals) + "\n")
    shm_evals = evaluate_shm(measured.points, raw)
    if shm_evals:
        print("### Targets of the shared-memory transport (issue 23 §1)\n")
        print(shm_targets_table(shm_evals) + "\n")
    foreign = [v for v in meta["foreign_cpu_cores"].values() if v is not None]
    noise = f"; other processes used ≤ {max(foreign):.2f} cores" if foreign else ""
    print(
        f"_{meta['date']}, {meta['cpu_count']} cores, TF {meta['tensorflow']}, "
        f"load {meta['loadavg_start'][0]:.2f} → {meta['loadavg_end'][0]:.2f}"
        f"{noise}; raw results in {args.json}_"
    )


def main() -> int:
    """Runs the selected parts, prints the report, writes the JSON."""
    args = parse_args()
    meta = metadata(args)
    load1 = meta["loadavg_start"][0]
    if load1 > 0.5:
        log(f"warning: 1-min load average is {load1:.2f}; numbers will be noisy")

    errors: list[str] = []
    phases = Phases()
    measured = measure_all(args, errors, phases)
    evals = evaluate(measured.points, measured.raw)
    meta["loadavg_end"] = os.getloadavg()
    # Average cores busy with *other* processes per phase: anything well
    # above 0 means the numbers of that phase are contaminated.
    meta["foreign_cpu_cores"] = phases.foreign_cores

    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "meta": meta,
        "raw": measured.raw,
        "points": measured.points,
        "targets": evals,
        "shm_targets": evaluate_shm(measured.points, measured.raw),
        "auto_targets": evaluate_auto(measured.points, measured.raw),
        "mpi_not_run": measured.mpi_note,
        "errors": errors,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_report(args, meta, measured, evals)
    for e in errors:
        log("ERROR " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
