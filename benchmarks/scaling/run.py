"""How the runtime scales: 32, 64 and 128 simulated workers on one machine.

Runs build/bench/runtime_scaling (benchmarks/scaling/runtime_scaling.cc: the
C++ runtime alone, no TensorFlow, NP forked processes on loopback, 4-byte
messages) once per worker count and topology, and prints markdown tables:

  * resources per worker once the topology's links are up (threads, open
    descriptors, resident memory; max and mean over the workers);
  * all-reduce and consensus latency, and the time of a resize: shrink by one
    (a worker leaves in order), grow by one (a pre-warmed joiner), crash of
    one (SIGKILL; detection, then the shrink), each up to the first
    all-reduce on the new membership;
  * a power-law fit of each quantity against n, what it predicts for 1,024
    workers, and which of this machine's limits that runs into first.

A run whose threads would not fit in what the machine has left (pid_max
minus the threads already running, with a margin for the other users of
the machine) is not started; the table says so and why.

    .venv/bin/python -m benchmarks.scaling                # ~5-10 min on 2 cores
    .venv/bin/python -m benchmarks.scaling --np 8,16 --topologies STAR
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.proc import log, run_group, worker_env
from benchmarks.harness.timing import parse_results
from benchmarks.harness.units import format_time
from benchmarks.scaling.growth import fit_power

REPO = Path(__file__).resolve().parents[2]
EXE = REPO / "build" / "bench" / "runtime_scaling"
TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "CLIQUE", "AUTO")
PREDICT_AT = 1024
# Threads left free for everything else on the machine while a run holds its own.
THREAD_MARGIN = 4096

# (key in the RESULT line, label, unit) of what is fitted against n.
GROWTH = (
    ("threads_mean", "threads per worker (mean)", "count"),
    ("fds_mean", "descriptors per worker (mean)", "count"),
    ("fds_max", "descriptors per worker (max)", "count"),
    ("rss_kb_mean", "resident memory per worker (mean)", "kb"),
    ("all_reduce_s", "all-reduce 4 B", "s"),
    ("consensus_s", "consensus", "s"),
    ("shrink_s", "shrink by one", "s"),
    ("grow_s", "grow by one", "s"),
    ("crash_s", "crash of one", "s"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", default="32,64,128", help="comma-separated worker counts (default 32,64,128)")
    p.add_argument("--topologies", default=",".join(TOPOLOGIES), help="default: " + ",".join(TOPOLOGIES))
    p.add_argument("--iters", type=int, default=20, help="all-reduces per timed loop (default 20)")
    p.add_argument("--repeats", type=int, default=5, help="timed loops per latency (default 5)")
    p.add_argument("--timeout", type=float, default=240.0, help="kill a run after this many seconds (default 240)")
    p.add_argument("--json", type=Path, default=REPO / "build" / "bench" / "scaling.json")
    args = p.parse_args(argv)
    try:
        args.np = [int(v) for v in args.np.split(",")]
    except ValueError as e:
        p.error(f"--np: {e}")
    args.topologies = [t.strip().upper() for t in args.topologies.split(",")]
    for t in args.topologies:
        if t not in TOPOLOGIES:
            p.error(f"--topologies: unknown {t!r}; choose from {','.join(TOPOLOGIES)}")
    if any(n < 3 for n in args.np):
        p.error("--np: the resize phases need at least 3 workers")
    if args.iters < 1 or args.repeats < 1:
        p.error("--iters and --repeats must be at least 1")
    return args


def machine_limits() -> dict[str, float]:
    """The limits a job of many workers on this machine runs into."""
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    with open("/proc/sys/kernel/threads-max") as f:
        threads_max = int(f.read())
    with open("/proc/meminfo") as f:
        mem_kb = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    nofile_soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {
        "threads": float(min(pid_max, threads_max)),  # every thread takes a pid
        "fds_per_process": float(nofile_soft),
        "memory_kb": float(mem_kb),
    }


def threads_running() -> int:
    """Threads on the machine now (the total of /proc/loadavg's 4th field)."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[1])


def threads_needed(n: int, topology: str) -> int:
    """An upper bound on the threads of one run. A link's sender thread
    starts with its first frame and a receiver serves each accepted
    connection, so threads follow the topology's edges: a few per worker,
    plus a sender and a receiver per peer on STAR's root (control messages
    and the resource count use STAR) and on the up to two workers that tell
    every peer of the crash. A 4-byte tensor travels one graph pair on every
    topology, CLIQUE and AUTO's probe included."""
    del topology  # the same bound for every topology at 4 bytes
    per_worker = 8
    return n * per_worker + 3 * 2 * (n - 1)


def run_one(n: int, topology: str, args: argparse.Namespace) -> dict[str, Any]:
    """One launch; its RESULT record, or one with 'skipped' / 'error'."""
    need, free = threads_needed(n, topology), machine_limits()["threads"] - threads_running()
    if need > free - THREAD_MARGIN:
        why = f"needs ~{need} threads, {int(free)} free of pid_max (margin {THREAD_MARGIN} for the machine's other users)"
        log(f"np={n} {topology}: not run: {why}")
        return {"np": n, "topology": topology, "skipped": why}
    argv = [str(EXE), str(n), topology, str(args.iters), str(args.repeats)]
    (res,) = run_group([argv], [worker_env()], timeout_s=args.timeout)
    found = parse_results(res.lines)
    if not res.ok or not found:
        log(f"np={n} {topology}: failed:\n{res.tail()}")
        return {"np": n, "topology": topology, "error": res.tail(12)}
    r = found[0]
    log(
        f"np={n} {topology}: all-reduce {format_time(r['all_reduce_s'])}, consensus {format_time(r['consensus_s'])}, "
        f"threads {r['threads_max']:.0f}, fds {r['fds_max']:.0f}, shrink {format_time(r['shrink_s'])}, "
        f"grow {format_time(r['grow_s'])}, crash {format_time(r['crash_s'])}"
    )
    return r


def cell(r: dict[str, Any], text: str) -> str:
    """A table cell, or why the run has no numbers."""
    if "skipped" in r:
        return "not run"
    if "error" in r:
        return "failed"
    return text


def resources_table(points: list[dict[str, Any]]) -> str:
    """Threads, descriptors and memory per worker."""
    rows = [
        "| np | topology | threads per worker, max · mean | descriptors, max · mean | resident memory, max · mean |",
        "| ---: | :--- | ---: | ---: | ---: |",
    ]
    for r in points:
        ok = "error" not in r and "skipped" not in r
        rows.append(
            f"| {r['np']} | {r['topology']} | "
            + " | ".join(
                cell(r, f"{r[k + '_max']:.0f} · {r[k + '_mean']:.1f}" if ok else "")
                for k in ("threads", "fds")
            )
            + " | "
            + cell(r, f"{r['rss_kb_max'] / 1024:.1f} · {r['rss_kb_mean'] / 1024:.1f} MiB" if ok else "")
            + " |"
        )
    return "\n".join(rows)


def latency_table(points: list[dict[str, Any]]) -> str:
    """All-reduce and consensus latency and the three resizes."""
    rows = [
        "| np | topology | all-reduce 4 B | consensus | shrink by one | grow by one | crash of one (detected after) |",
        "| ---: | :--- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in points:
        ok = "error" not in r and "skipped" not in r
        vals = (
            [
                format_time(r["all_reduce_s"]),
                format_time(r["consensus_s"]),
                format_time(r["shrink_s"]),
                format_time(r["grow_s"]),
                f"{format_time(r['crash_s'])} ({format_time(r['crash_detect_s'])})",
            ]
            if ok
            else [""] * 5
        )
        rows.append(f"| {r['np']} | {r['topology']} | " + " | ".join(cell(r, v) for v in vals) + " |")
    return "\n".join(rows)


def format_value(value: float, unit: str) -> str:
    """A fitted or predicted value in its unit."""
    if unit == "s":
        return format_time(value)
    if unit == "kb":
        return f"{value / 1024:.1f} MiB"
    return f"{value:.0f}"


def growth_table(points: list[dict[str, Any]], topologies: list[str]) -> tuple[str, dict[str, dict[str, float]]]:
    """Power-law exponents and the prediction at PREDICT_AT workers, per topology."""
    nps = sorted({r["np"] for r in points})
    rows = [
        (
            f"| quantity | topology | growth (n^k fitted over np = {', '.join(map(str, nps))}) | "
            f"predicted at {PREDICT_AT} workers |"
        ),
        "| :--- | :--- | ---: | ---: |",
    ]
    predicted: dict[str, dict[str, float]] = {}
    for key, label, unit in GROWTH:
        for topo in topologies:
            pts = [r for r in points if r["topology"] == topo and key in r]
            if len(pts) < 2:
                continue
            fit = fit_power([r["np"] for r in pts], [float(r[key]) for r in pts])
            value = fit.predict(PREDICT_AT)
            predicted.setdefault(topo, {})[key] = value
            rows.append(f"| {label} | {topo} | n^{fit.exponent:.2f} | {format_value(value, unit)} |")
    return "\n".join(rows), predicted


def exhaustion_table(predicted: dict[str, dict[str, float]], limits: dict[str, float]) -> str:
    """Per topology: what 1,024 workers on this machine would need against its limits."""
    rows = [
        (
            f"| topology | threads on the machine ({PREDICT_AT} × per worker) | descriptors per worker | "
            "memory on the machine | runs out first |"
        ),
        "| :--- | ---: | ---: | ---: | :--- |",
    ]
    for topo, p in predicted.items():
        if not all(k in p for k in ("threads_mean", "fds_max", "rss_kb_mean")):
            continue
        need = {
            "threads": (PREDICT_AT * p["threads_mean"], limits["threads"]),
            "descriptors": (p["fds_max"], limits["fds_per_process"]),
            "memory": (PREDICT_AT * p["rss_kb_mean"], limits["memory_kb"]),
        }
        first = max(need, key=lambda k: need[k][0] / need[k][1])
        ratio = need[first][0] / need[first][1]
        verdict = f"{first} ({ratio:.2g}× the limit)" if ratio >= 1 else f"nothing ({first} at {ratio:.0%})"
        rows.append(
            f"| {topo} | {need['threads'][0]:,.0f} of {limits['threads']:,.0f} | "
            f"{need['descriptors'][0]:,.0f} of {limits['fds_per_process']:,.0f} | "
            f"{need['memory'][0] / 2**20:,.1f} of {limits['memory_kb'] / 2**20:,.1f} GiB | {verdict} |"
        )
    return "\n".join(rows)


def main() -> int:
    """Runs every (np, topology), prints the tables, writes the JSON."""
    args = parse_args()
    if not EXE.exists():
        log(f"{EXE.relative_to(REPO)} is missing: build it with `make {EXE.relative_to(REPO)}` (make bench-scaling does)")
        return 2
    meta = machine_metadata()
    limits = machine_limits()
    points = [run_one(n, topo, args) for n in args.np for topo in args.topologies]
    meta["loadavg_end"] = os.getloadavg()
    growth, predicted = growth_table(points, args.topologies)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "limits": limits, "points": points}, indent=2) + "\n")

    print("### Resources per worker (links of the topology up)\n")
    print(resources_table(points) + "\n")
    print("### Latency and resizes (4-byte messages; medians on rank 0)\n")
    print(latency_table(points) + "\n")
    print("### Growth with n\n")
    print(growth + "\n")
    print(f"### {PREDICT_AT} workers on this machine\n")
    print(exhaustion_table(predicted, limits) + "\n")
    for r in points:
        if "skipped" in r:
            print(f"- np={r['np']} {r['topology']} not run: {r['skipped']}")
    print(
        f"\n_{meta['date']}, {meta['cpu_count']} cores, load {meta['loadavg_start'][0]:.2f} → "
        f"{meta['loadavg_end'][0]:.2f}; pid_max/threads-max {limits['threads']:.0f}, "
        f"descriptors per process {limits['fds_per_process']:.0f}; raw results in {args.json}_"
    )
    return 1 if any("error" in r for r in points) else 0


if __name__ == "__main__":
    sys.exit(main())
