"""AUTO's probe across a slow link (issue 23 §2): what it costs and whether it picks the fastest topology.

4 ranks of the runtime alone (``benchmarks/allreduce/runtime_allreduce.cc``,
no TensorFlow) on two emulated hosts (network namespaces, 2 ranks each, a
``tc`` tbf link of ``--rate``) all-reduce one ``--bytes`` tensor under one
name, call after call (``--calls`` timed calls after 3 untimed ones, a
barrier before each), as a training step all-reduces a gradient. Runs, in
rotating order, ``--rounds`` times:

- ``AUTO`` as shipped (its probe prunes after one sample: KUNGFU_AUTO_PRUNE
  unset, 1.5);
- ``AUTO, no pruning`` (KUNGFU_AUTO_PRUNE=0: three timed samples of every
  candidate);
- ``AUTO, fixed rule`` (KUNGFU_AUTO_PROBES=0: no probe, the size rule);
- every fixed topology, the reference AUTO is judged against.

Per run: the topology AUTO ended on, the median of the last 5 calls (the
steady state), the sum of all timed calls, the probe's cost (that sum less
``--calls`` times the steady state), and how many of rank 0's calls waited
for a timed sample of the probe (which runs alone in its class).

    .venv/bin/python -m benchmarks.auto_probe        # root, ~8 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.allreduce.run import compile_with_runtime
from benchmarks.harness.hosts import make_limited_hosts
from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.proc import log, run_group, worker_env
from benchmarks.harness.timing import parse_results

FIXED = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")
AUTO_RUNS = {
    "AUTO": {},
    "AUTO, no pruning": {"KUNGFU_AUTO_PRUNE": "0"},
    "AUTO, fixed rule": {"KUNGFU_AUTO_PROBES": "0"},
}
STEADY_CALLS = 5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--rate",
        default="100mbit",
        help="the link between the two hosts (tc rate; default 100mbit)",
    )
    p.add_argument(
        "--bytes",
        type=int,
        default=4 << 20,
        help="the tensor all-reduced (default 4 MiB)",
    )
    p.add_argument(
        "--calls", type=int, default=25, help="timed calls per run (default 25)"
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="runs of each AUTO setting (default 2)"
    )
    p.add_argument("--json", type=Path, help="also write the raw records here")
    args = p.parse_args(argv)
    if (
        args.calls <= STEADY_CALLS
        or args.rounds < 1
        or args.bytes < 4
        or args.bytes % 4
    ):
        p.error(
            f"need --calls > {STEADY_CALLS}, --rounds >= 1 and --bytes a positive multiple of 4"
        )
    return args


def summarize(samples: list[float]) -> dict[str, float]:
    """The steady state (median of the last calls), the sum, and what the calls cost beyond the steady state."""
    steady = statistics.median(samples[-STEADY_CALLS:])
    total = sum(samples)
    return {
        "steady_s": steady,
        "total_s": total,
        "probe_cost_s": total - steady * len(samples),
    }


def run_once(
    exe: str,
    hosts: Any,
    topology: str,
    extra_env: dict[str, str],
    args: argparse.Namespace,
) -> dict:
    """One job of 4 ranks, 2 per host; rank 0's record and its AUTO log lines."""
    a, b = hosts.addresses
    peers = ",".join([f"{a}:31000", f"{a}:31001", f"{b}:31000", f"{b}:31001"])
    argvs, envs = [], []
    for rank in range(4):
        cmd = [
            exe,
            "4",
            topology,
            str(args.bytes),
            "1",
            str(args.calls),
            peers,
            str(rank),
            "repeated",
        ]
        argvs.append(hosts.exec_prefix(rank // 2) + cmd)
        envs.append(worker_env({"KUNGFU_AUTO_LOG": "1", **extra_env}))
    results = run_group(argvs, envs, timeout_s=60 + 30 * args.calls)
    found = parse_results(results[0].lines)
    if not all(r.ok for r in results) or not found:
        raise RuntimeError(
            f"{topology} {extra_env} failed:\n" + "\n".join(r.tail() for r in results)
        )
    rec = found[0]
    rec["probe_log"] = [line for line in results[0].lines if "AUTO probe" in line]
    return rec


def run_all(args: argparse.Namespace) -> dict[str, list[dict]]:
    exe = compile_with_runtime("runtime_allreduce", errors := [])
    if exe is None:
        raise RuntimeError("; ".join(errors))
    hosts, why = make_limited_hosts("10.221.0", "kfap", rate=args.rate)
    if hosts is None:
        raise RuntimeError(f"cannot emulate two hosts: {why}")
    runs: dict[str, list[dict]] = {}
    try:
        names = list(AUTO_RUNS)
        for r in range(args.rounds):
            for name in (
                names[r % len(names) :] + names[: r % len(names)]
            ):  # rotating order
                rec = run_once(exe, hosts, "AUTO", AUTO_RUNS[name], args)
                rec.update(summarize(rec["samples"]))
                runs.setdefault(name, []).append(rec)
                log(
                    f"{name}: {rec['auto_choice'] or '(prediction)'}, steady {rec['steady_s']:.3f} s, "
                    f"probe cost {rec['probe_cost_s']:.1f} s"
                )
        for topology in FIXED:
            rec = run_once(exe, hosts, topology, {}, args)
            rec.update(summarize(rec["samples"]))
            runs[topology] = [rec]
            log(f"{topology}: steady {rec['steady_s']:.3f} s")
    finally:
        hosts.destroy()
    return runs


def report(
    runs: dict[str, list[dict]], meta: dict[str, Any], args: argparse.Namespace
) -> str:
    best = min(FIXED, key=lambda t: runs[t][0]["steady_s"])
    best_s = runs[best][0]["steady_s"]
    lines = [
        f"AUTO's probe, {args.bytes} B at np=4 on two hosts, {args.rate} link; {args.calls} timed calls per run",
        "",
        "| run | chose | steady state | ÷ best fixed | sum of the calls | probe's cost | calls held by a sample |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for name in list(AUTO_RUNS) + list(FIXED):
        for rec in runs.get(name, []):
            chose = rec["auto_choice"] or ("–" if name in FIXED else "(prediction)")
            lines.append(
                f"| {name} | {chose} | {rec['steady_s']:.3f} s | {rec['steady_s'] / best_s:.2f} | "
                f"{rec['total_s']:.1f} s | {rec['probe_cost_s']:.1f} s | {rec.get('calls_held_for_sample', '–')} |"
            )
    load = meta["loadavg_start"]
    lines += [
        "",
        (
            f"Best fixed topology: {best} ({best_s:.3f} s per call). Probe cost: the calls' sum less "
            f"{args.calls} × the run's steady state."
        ),
        (
            f"_{meta['date']}, {meta['cpu_count']} cores, load average at the start "
            f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}._"
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if os.geteuid() != 0:
        print(
            "benchmarks.auto_probe needs root (network namespaces, tc)", file=sys.stderr
        )
        return 2
    meta = machine_metadata()
    runs = run_all(args)
    print(report(runs, meta, args))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1))
    return 0
