"""Strategy benchmark: every strategy builder on every model, one host and two.

For every selected model, in one run, 4 workers (``--np``) train with
``SynchronousSGDOptimizer(strategy=BUILDER)`` for every builder of
``kungfu_tf.strategy.builders`` (benchmarks/strategies/worker.py), in two settings:

  * ``one-host``: one ``kungfu-run -np 4`` on loopback;
  * ``two-hosts``: two Linux network namespaces joined by a veth pair, one
    ``kungfu-run`` in each with 2 workers (``-H A:2,B:2``), the link limited
    by a ``tc`` token-bucket filter (``--link``, default 1 Gbit/s) on both
    ends. Same-host peers talk over the namespace's own loopback, so only
    inter-host traffic meets the limit — what a cluster of 2-GPU machines on
    a 1 GbE network looks like. Needs root (``ip netns``); without it the
    setting is reported as skipped.

``Auto`` (``builders.Auto``) is a column like the builders: its searches run
first in the same workers (benchmarks/strategies/auto_searches.py), then its
chosen strategy is timed in the same rounds; the report adds its targets,
the search's cost, the ranking accuracy by bucket and a plot of the search
(benchmarks/strategies/auto_report.py).

All builders of one (model, setting) run in the same worker processes, each
with its own optimizer and traced step, timed in rotating rounds (see the
worker), so they are compared side by side under the same conditions. The
report gives the per-iteration time of each builder, its traffic (all
workers, and the part that crossed hosts), the best builder per row, and
where PS with partitioning beats all-reduce and the reverse.

    .venv/bin/python -m benchmarks.strategies                    # everything, ~30 min
    .venv/bin/python -m benchmarks.strategies --models ncf,comm-heavy-mlp
    .venv/bin/python -m benchmarks.strategies --settings one-host --rounds 1
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import comma_choices
from benchmarks.harness.hosts import (
    TwoHosts,
    make_limited_hosts,
    two_host_commands,
    two_host_env,
)
from benchmarks.harness.load import CpuMeter
from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.proc import log, run_group, worker_env
from benchmarks.harness.timing import parse_results
from benchmarks.harness.units import format_time
from benchmarks.training.run import ALL_MODELS

EXP_DIR = Path(__file__).resolve().parent
BENCH_DIR = EXP_DIR.parent
REPO = BENCH_DIR.parent
BUILD_DIR = REPO / "build" / "bench"
from benchmarks.harness.paths import RESULTS_DIR
from benchmarks.strategies.auto_report import print_auto_report
from benchmarks.strategies.auto_searches import AUTO
from benchmarks.strategies.worker import DEFAULT
from kungfu_tf.strategy.builders import BUILDERS

SETTINGS = ("one-host", "two-hosts")
SUBNET = "10.217.0"  # the emulated hosts' /24; no test uses it
# Timed steps per block unless --steps is given: enough for a measurable
# block on fast models, few on the slow ones.
DEFAULT_STEPS = {"teacher-mlp": 20, "digits-mlp": 20, "resnet20": 3, "ncf": 5}
FALLBACK_STEPS = 2
# The builders that partition variables over parameter servers, and the one
# that all-reduces everything: the comparison the issue asks for.
PARTITIONED_PS = ("PartitionedPS", "UnevenPartitionedPS")
ALL_REDUCE = "AllReduce"
# Builders within this fraction of the fastest share the "best" cell: the
# blocks of one builder vary by about this much on this machine.
TIE_FRACTION = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--models", default="all", help="comma-separated, or 'all' (default)"
    )
    p.add_argument(
        "--builders",
        default="all",
        help=f"comma-separated builder names and/or {DEFAULT!r} (no strategy), or 'all' (default)",
    )
    p.add_argument(
        "--settings", default=",".join(SETTINGS), help="subset of one-host,two-hosts"
    )
    p.add_argument("--np", type=int, default=4, help="workers (even; half per host)")
    p.add_argument(
        "--link", default="1gbit", help="inter-host rate for tc tbf (default 1gbit)"
    )
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per builder")
    p.add_argument(
        "--steps",
        type=int,
        help=f"timed steps per block (default {DEFAULT_STEPS}, else {FALLBACK_STEPS})",
    )
    p.add_argument("--rounds", type=int, default=2, help="timed blocks per builder")
    p.add_argument(
        "--inter-op", type=int, default=2, help="TF inter-op threads (intra-op is 1)"
    )
    p.add_argument("--auto-budget", type=int, default=8, help="trials of each Auto search")
    p.add_argument("--auto-trials-per-round", type=int, default=4, help="Auto trials between ranker refits")
    p.add_argument(
        "--plot", type=Path, default=RESULTS_DIR / "strategies_auto.png", help="Auto's search plot"
    )
    p.add_argument(
        "--launch-timeout", type=float, default=1800.0, help="kill a launch after this"
    )
    p.add_argument(
        "--json", type=Path, default=BUILD_DIR / "strategies.json", help="raw results"
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="print the report of an earlier run's raw results instead of running",
    )
    args = p.parse_args(argv)

    args.models = comma_choices(p, "--models", args.models, ALL_MODELS)
    args.builders = comma_choices(p, "--builders", args.builders, [DEFAULT, *BUILDERS, AUTO])
    args.settings = comma_choices(
        p, "--settings", args.settings, SETTINGS, allow_all=False
    )
    if args.np < 2 or args.np % 2:
        p.error("--np must be even and at least 2 (half the workers on each host)")
    for name in ("warmup", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def worker_argv(model: str, setting: str, args: argparse.Namespace) -> list[str]:
    """The worker program and its options (the same on every host)."""
    steps = args.steps or DEFAULT_STEPS.get(model, FALLBACK_STEPS)
    return [
        sys.executable, str(EXP_DIR / "worker.py"),
        "--model", model, "--builders", ",".join(args.builders), "--setting", setting,
        "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
        "--steps", str(steps), "--rounds", str(args.rounds),
        "--auto-budget", str(args.auto_budget), "--auto-trials-per-round", str(args.auto_trials_per_round),
        "--intra-op", "1", "--inter-op", str(args.inter_op),
    ]  # fmt: skip


def launch(
    model: str,
    setting: str,
    hosts: TwoHosts | None,
    args: argparse.Namespace,
    errors: list[str],
) -> list[dict[str, Any]]:
    """One job of ``args.np`` workers; returns rank 0's result records."""
    if hosts is None:
        launcher = [sys.executable, "-m", "kungfu_tf.run", "-np", str(args.np)]
        argvs, envs = [launcher + worker_argv(model, setting, args)], [worker_env()]
    else:
        argvs = two_host_commands(hosts, args.np, worker_argv(model, setting, args))
        env = two_host_env()
        envs = [env, env]
    meter, t0 = CpuMeter(), time.monotonic()
    results = run_group(argvs, envs, timeout_s=args.launch_timeout, cwd=str(REPO))
    wall = time.monotonic() - t0
    records = [r for res in results for r in parse_results(res.lines)]
    for i, res in enumerate(results):
        if not res.ok:
            errors.append(
                f"{model} {setting} launcher {i}: exit status {res.returncode}:\n{res.tail()}"
            )
    missing = set(args.builders) - {r["builder"] for r in records}
    if missing and all(res.ok for res in results):
        errors.append(f"{model} {setting}: no result for {', '.join(sorted(missing))}")
    foreign = meter.foreign(wall)
    for r in records:
        r["launch_wall_s"], r["foreign_cpu_cores"] = wall, foreign
    log(f"{model} {setting}: {len(records)} builders in {wall:.0f} s")
    return records


def make_hosts(args: argparse.Namespace) -> tuple[TwoHosts | None, str | None]:
    """The two emulated hosts with the limited link, or why they are unavailable."""
    return make_limited_hosts(SUBNET, "kfs", rate=args.link)


def by_cell(points: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(setting, model, builder) -> record."""
    return {(p["setting"], p["model"], p["builder"]): p for p in points}


def verdict_of(ratio: float) -> str:
    """AllReduce time / partitioned-PS time in words; within TIE_FRACTION it is a tie."""
    if abs(ratio - 1.0) <= TIE_FRACTION:
        return "tie"
    return "PS wins" if ratio > 1 else "AR wins"


def fastest_builders(timed: dict[str, float]) -> list[str]:
    """The builders (not the default, not Auto) within TIE_FRACTION of the fastest one, fastest first."""
    builders = {b: t for b, t in timed.items() if b not in (DEFAULT, AUTO)}
    if not builders:
        return []
    best = min(builders.values())
    return sorted(
        (b for b, t in builders.items() if t <= best * (1 + TIE_FRACTION)),
        key=builders.get,
    )


def comparisons(
    points: list[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Per (setting, model): the fastest builders (ties included), and best partitioned PS against AllReduce."""
    cells = by_cell(points)
    out = []
    for setting in args.settings:
        for model in args.models:
            row = {b: cells.get((setting, model, b)) for b in args.builders}
            timed = {
                b: r["step_s"] for b, r in row.items() if r is not None and b != DEFAULT
            }
            if not timed:
                continue
            fastest = fastest_builders(timed)
            ps = [b for b in PARTITIONED_PS if b in timed]
            best_ps = min(ps, key=timed.get) if ps else None
            ratio = (
                timed[ALL_REDUCE] / timed[best_ps]
                if best_ps and ALL_REDUCE in timed
                else None
            )
            out.append(
                {"setting": setting, "model": model, "fastest": fastest, "best_partitioned_ps": best_ps,
                 "allreduce_over_partitioned_ps": ratio}
            )  # fmt: skip
    return out


def print_report(
    points: list[dict[str, Any]], comps: list[dict[str, Any]], skipped: dict[str, str],
    meta: dict[str, Any], args: argparse.Namespace,
) -> None:  # fmt: skip
    """Markdown tables on stdout."""
    cells = by_cell(points)
    short = {
        b: b.replace("Partitioned", "Part.").replace("LoadBalancing", "LB")
        for b in args.builders
    }
    short[DEFAULT] = "no strategy"
    for setting in args.settings:
        title = (
            "one host (loopback)"
            if setting == "one-host"
            else f"two hosts, {args.np // 2} workers each, link {args.link}"
        )
        print(f"### Per-iteration time, np={args.np}, {title}\n")
        if setting in skipped:
            print(f"_skipped: {skipped[setting]}_\n")
            continue
        print("| model | " + " | ".join(short[b] for b in args.builders) + " | best |")
        print("|---|" + "---:|" * len(args.builders) + "---|")
        for model in args.models:
            row = {b: cells.get((setting, model, b)) for b in args.builders}
            timed = {b: r["step_s"] for b, r in row.items() if r is not None}
            best = fastest_builders(timed)
            shown = []
            for b in args.builders:
                if b not in timed:
                    shown.append("—")
                    continue
                cell = format_time(timed[b])
                shown.append(f"**{cell}**" if b in best else cell)
            print(
                f"| {model} | "
                + " | ".join(shown)
                + f" | {' ≈ '.join(short[b] for b in best) or '—'} |"
            )
        print()
        if setting == "two-hosts":
            print("MB crossing the link per step (both directions, all workers):\n")
            print("| model | " + " | ".join(short[b] for b in args.builders) + " |")
            print("|---|" + "---:|" * len(args.builders))
            for model in args.models:
                row = [cells.get((setting, model, b)) for b in args.builders]
                print(f"| {model} | " + " | ".join(
                    "—" if r is None else f"{r['cross_host_bytes_per_step'] / 1e6:.1f}" for r in row) + " |")  # fmt: skip
            print()
    print("### Partitioned PS against all-reduce\n")
    print(
        "| setting | model | fastest builder | best partitioned PS | AllReduce time / partitioned PS time |"
    )
    print("|---|---|---|---|---:|")
    for c in comps:
        ratio = c["allreduce_over_partitioned_ps"]
        verdict = "—" if ratio is None else f"{ratio:.2f} ({verdict_of(ratio)})"
        print(
            f"| {c['setting']} | {c['model']} | {' ≈ '.join(c['fastest'])} | {c['best_partitioned_ps'] or '—'} | {verdict} |"
        )
    clear = sorted({c["fastest"][0] for c in comps if len(c["fastest"]) == 1})
    print(
        f"\nBuilders fastest by more than {TIE_FRACTION:.0%} in at least one row: {', '.join(clear) or 'none'}."
    )
    if DEFAULT in args.builders:
        print(
            f"'no strategy' is SynchronousSGDOptimizer without a strategy (fused all-reduce buckets of at most "
            f"64 MiB), the baseline; it is not counted as a builder. Bold: within {TIE_FRACTION:.0%} of the fastest builder."
        )
    print_auto_report(points, [b for b in args.builders if b in BUILDERS], args.plot)
    foreign = [
        p["foreign_cpu_cores"] for p in points if p.get("foreign_cpu_cores") is not None
    ]
    noise = f"; other processes used ≤ {max(foreign):.2f} cores" if foreign else ""
    print(
        f"\n_{meta['date']}, {meta['cpu_count']} cores, TF {meta['tensorflow']}, batch {args.batch_size} "
        f"per worker, SGD + momentum, intra-op 1 / inter-op {args.inter_op} threads per worker, "
        f"median of {args.rounds} blocks per builder{noise}; raw results in {args.json}_"
    )


def reprint(path: Path, plot: Path) -> int:
    """The report of a saved run, with that run's own settings; the plot goes to ``plot`` (the --plot given now)."""
    saved = json.loads(path.read_text())
    args = parse_args(_argv_of(saved["meta"]["args"]))
    args.json, args.plot = path, plot
    print_report(
        saved["points"],
        comparisons(saved["points"], args),
        saved["skipped"],
        saved["meta"],
        args,
    )
    return 1 if saved["errors"] else 0


def _argv_of(saved_args: dict[str, str]) -> list[str]:
    """Command-line options that reproduce the saved (stringified) arguments."""
    argv = []
    for key in ("models", "builders", "settings"):
        argv += [f"--{key}", ",".join(ast.literal_eval(saved_args[key]))]
    for key in ("np", "link", "batch_size", "warmup", "rounds", "inter_op", "auto_budget", "auto_trials_per_round"):
        if key not in saved_args:  # a run from before the option existed
            continue
        argv += [f"--{key.replace('_', '-')}", saved_args[key]]
    return argv


def main(argv: list[str] | None = None) -> int:
    """Runs every (model, setting) launch, prints the report, writes JSON."""
    args = parse_args(argv)
    if args.report is not None:
        return reprint(args.report, args.plot)
    # A SIGTERM must still run the finally below, or the namespaces outlive us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    meta = {**machine_metadata(), "args": {k: str(v) for k, v in vars(args).items()}}
    if meta["loadavg_start"][0] > 0.5:
        log(
            f"warning: 1-min load average is {meta['loadavg_start'][0]:.2f}; numbers will be noisy"
        )
    errors: list[str] = []
    points: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    hosts: TwoHosts | None = None
    try:
        if "two-hosts" in args.settings:
            hosts, why = make_hosts(args)
            if hosts is None:
                skipped["two-hosts"] = why or "unavailable"
                log(f"two-hosts setting skipped: {why}")
        for model in args.models:
            for setting in args.settings:
                if setting in skipped:
                    continue
                log(f"{model} {setting} ...")
                points += launch(
                    model,
                    setting,
                    hosts if setting == "two-hosts" else None,
                    args,
                    errors,
                )
    finally:
        if hosts is not None:
            hosts.destroy()
    comps = comparisons(points, args)
    meta["loadavg_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "meta": meta,
        "points": points,
        "comparisons": comps,
        "skipped": skipped,
        "errors": errors,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_report(points, comps, skipped, meta, args)
    for e in errors:
        log("ERROR " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
