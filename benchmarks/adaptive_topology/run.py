"""Adaptive topology under link contention (KungFu §6.2 (2)): a static topology against AdaptiveTopologyPolicy.

4 workers (``--np``) on two emulated hosts (network namespaces, 2 workers
each, a ``tc`` tbf-limited veth link of ``--link`` between them, see
benchmarks/harness/hosts.py) train the same MLP on digits (benchmarks/adaptive_topology/worker.py;
``--hidden`` sets the gradient size, a few MB, so the all-reduce is
significant at that rate) for a fixed number of steps. After
``--before`` steps the benchmark starts its own TCP traffic between the two
hosts, ``--traffic`` in each direction on ``--flows`` connections
(benchmarks/adaptive_topology/background_traffic.py), and stops it ``--during`` steps later; ``--after``
steps follow. Each run (``--runs``) starts the job with a topology
(``kungfu-run --topology``); ``:adaptive`` adds ``AdaptiveTopologyPolicy``,
which notices the throughput drop, tries the other topologies and keeps the
fastest. The default runs: static RING (the job's topology), RING with the
policy, and static BINARY_TREE_STAR as the reference the policy should reach.

With ranks 0, 1 on host A and 2, 3 on host B, RING, CLIQUE, STAR and
BINARY_TREE move twice the gradient size across the link in each direction
per step, BINARY_TREE_STAR (star inside a host, tree across hosts) once.
The traffic is paced by default: unpaced TCP takes a share per connection,
and RING has two connections across the link per direction where
BINARY_TREE_STAR has one, which blurs the comparison (``--traffic 0``).

Steps are assigned to phases by their wall-clock times against the moments
the traffic was started and stopped (a step overlapping either moment is a
"transition" step and left out). The report gives each run's throughput
(samples/s, all workers: the samples of the phase's steps over their wall
time, the policy's own time between steps included) per phase, writes the
raw records to ``--json`` and plots throughput against step to ``--plot``.

    .venv/bin/python -m benchmarks.adaptive_topology            # ~7 min, root
    .venv/bin/python -m benchmarks.adaptive_topology --report benchmarks/results/adaptive_topology.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.adaptive_topology.background_traffic import (
    BackgroundTraffic,
    parse_rate,
)
from benchmarks.harness.hosts import (
    TwoHosts,
    make_limited_hosts,
    two_host_commands,
    two_host_env,
)
from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import REPO, RESULTS_DIR
from benchmarks.harness.proc import log, run_group
from benchmarks.harness.timing import RESULT_TAG, parse_results

EXP_DIR = Path(__file__).resolve().parent
SUBNET = "10.219.0"  # the emulated hosts' /24; no test or other benchmark uses it
TRAFFIC_PORT = 5219
PHASES = ("before", "during", "after")
TRANSITION = "transition"
TOPOLOGIES = ("RING", "STAR", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")


# --------------------------------------------------------------- runs and phases
def parse_run(text: str) -> tuple[str, bool]:
    """``TOPOLOGY`` or ``TOPOLOGY:adaptive`` -> (topology, adaptive).

    Example:
        >>> parse_run("ring:adaptive")
        ('RING', True)
    """
    name, _, mode = text.strip().partition(":")
    name = name.upper()
    if name not in TOPOLOGIES:
        raise ValueError(
            f"run {text!r}: unknown topology {name!r}; choose from {', '.join(TOPOLOGIES)}"
        )
    if mode not in ("", "adaptive"):
        raise ValueError(
            f"run {text!r}: unknown mode {mode!r}; write TOPOLOGY or TOPOLOGY:adaptive"
        )
    return name, mode == "adaptive"


def run_label(topology: str, adaptive: bool) -> str:
    """How a run is named in the table and the plot."""
    return f"{topology} + AdaptiveTopologyPolicy" if adaptive else f"static {topology}"


def phase_of(start: float, end: float, traffic_on: float, traffic_off: float) -> str:
    """The phase of a step that ran from ``start`` to ``end`` (wall clock), given when the traffic ran.

    Example:
        >>> [phase_of(s, s + 1, 10, 20) for s in (5, 9.5, 12, 19.5, 21)]
        ['before', 'transition', 'during', 'transition', 'after']
    """
    if end <= traffic_on:
        return "before"
    if start >= traffic_on and end <= traffic_off:
        return "during"
    if start >= traffic_off:
        return "after"
    return TRANSITION


def throughput(steps: Sequence[dict[str, Any]], batch_size: int) -> float:
    """Samples per second over ``steps``: their samples over their summed wall time (NaN for none)."""
    wall = sum(s["end"] - s["start"] for s in steps)
    return len(steps) * batch_size / wall if steps and wall > 0 else math.nan


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Per-phase throughput of one run's step records, and its topologies.

    ``run`` has ``steps`` (the worker's step records), ``batch_size``,
    ``traffic_on`` and ``traffic_off``. "during_second_half" is the second
    half of the contended steps: after the policy's trials, where it had time
    to settle. Example (made-up steps of 1 s, batch 10):

        >>> steps = [{"step": i, "start": i, "end": i + 1, "topology": "RING"} for i in range(6)]
        >>> s = summarize({"steps": steps, "batch_size": 10, "traffic_on": 2, "traffic_off": 4.5})
        >>> s["steps"], s["throughput"]["during"]
        ({'before': 2, 'during': 2, 'after': 1, 'transition': 1}, 10.0)
    """
    by_phase: dict[str, list[dict[str, Any]]] = {p: [] for p in (*PHASES, TRANSITION)}
    for s in run["steps"]:
        by_phase[
            phase_of(s["start"], s["end"], run["traffic_on"], run["traffic_off"])
        ].append(s)
    during = by_phase["during"]
    out = {p: throughput(by_phase[p], run["batch_size"]) for p in PHASES}
    out["during_second_half"] = throughput(
        during[len(during) // 2 :], run["batch_size"]
    )
    topologies = {p: sorted({s["topology"] for s in by_phase[p]}) for p in PHASES}
    last = {p: by_phase[p][-1]["topology"] if by_phase[p] else None for p in PHASES}
    return {
        "steps": {p: len(v) for p, v in by_phase.items()},
        "throughput": out,
        "topologies": topologies,
        "last_topology": last,
    }


# --------------------------------------------------------------- running
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--runs",
        default="RING,RING:adaptive,BINARY_TREE_STAR",
        help="comma-separated TOPOLOGY[:adaptive] (default %(default)s)",
    )
    p.add_argument("--np", type=int, default=4, help="workers (even; half per host)")
    p.add_argument(
        "--link",
        default="100mbit",
        help="inter-host rate for tc tbf (default %(default)s)",
    )
    p.add_argument(
        "--hidden",
        default="1024,1024",
        help="MLP hidden widths (gradient size; default %(default)s)",
    )
    p.add_argument(
        "--batch-size", type=int, default=64, help="global batch (default %(default)s)"
    )
    p.add_argument(
        "--before", type=int, default=20, help="steps before the traffic starts"
    )
    p.add_argument("--during", type=int, default=60, help="steps with the traffic")
    p.add_argument("--after", type=int, default=20, help="steps after it stopped")
    p.add_argument(
        "--flows", type=int, default=2, help="background TCP flows per direction"
    )
    p.add_argument(
        "--traffic",
        default="40mbit",
        help="background rate per direction, in tc units; 0: unpaced (default %(default)s)",
    )
    p.add_argument(
        "--drop", type=float, default=0.2, help="AdaptiveTopologyPolicy(drop=)"
    )
    p.add_argument(
        "--window", type=int, default=5, help="AdaptiveTopologyPolicy(window=)"
    )
    p.add_argument(
        "--trial-steps",
        type=int,
        default=3,
        help="AdaptiveTopologyPolicy(trial_steps=)",
    )
    p.add_argument(
        "--settle-steps",
        type=int,
        default=1,
        help="AdaptiveTopologyPolicy(settle_steps=)",
    )
    p.add_argument(
        "--launch-timeout", type=float, default=600.0, help="kill a run after this (s)"
    )
    p.add_argument(
        "--json",
        type=Path,
        default=RESULTS_DIR / "adaptive_topology.json",
        help="raw results",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=RESULTS_DIR / "adaptive_topology.png",
        help="throughput vs step",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="report (and plot) an earlier run's raw results",
    )
    args = p.parse_args(argv)
    try:
        args.runs = [parse_run(r) for r in args.runs.split(",")]
    except ValueError as e:
        p.error(f"--runs: {e}")
    try:
        args.traffic_bytes = 0.0 if args.traffic == "0" else parse_rate(args.traffic)
    except ValueError as e:
        p.error(f"--traffic: {e}")
    if args.np < 2 or args.np % 2:
        p.error(
            f"--np must be even and at least 2 (half the workers on each host), got {args.np}"
        )
    for name in ("before", "during", "after"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


class ContentionSchedule:
    """Starts the traffic once rank 0 reported step ``before - 1`` and stops it after step ``before + during - 1``.

    Fed every output line of the host-A launcher (which runs rank 0); runs
    in run_group's reader thread.
    """

    def __init__(self, traffic: BackgroundTraffic, before: int, during: int, what: str = "background traffic"):
        # what: the log's name of what is switched (benchmarks/strategy_policy throttles the link instead)
        self.traffic, self.before, self.during, self.what = traffic, before, during, what
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def on_line(self, launcher: int, line: str) -> None:
        if launcher != 0 or RESULT_TAG not in line:
            return
        records = parse_results([line])
        if not records or records[0].get("kind") != "step":
            return
        done = records[0]["step"] + 1
        with self._lock:
            try:
                if done == self.before:
                    self.traffic.start()
                    log(f"  step {done}: {self.what} on")
                elif done == self.before + self.during:
                    self.traffic.stop()
                    log(f"  step {done}: {self.what} off")
            except BaseException as e:  # noqa: BLE001 -- reported by the main thread
                self.error = e


def launch(
    topology: str, adaptive: bool, hosts: TwoHosts, args: argparse.Namespace
) -> dict[str, Any]:
    """One job; returns its step records, the traffic times and the policy's decisions."""
    label = run_label(topology, adaptive)
    worker = [
        sys.executable, str(EXP_DIR / "worker.py"), "--run", label,
        "--steps", str(args.before + args.during + args.after), "--batch-size", str(args.batch_size),
        "--hidden", args.hidden, "--drop", str(args.drop), "--window", str(args.window),
        "--trial-steps", str(args.trial_steps), "--settle-steps", str(args.settle_steps),
    ]  # fmt: skip
    if adaptive:
        worker.append("--adaptive")
    argvs = two_host_commands(hosts, args.np, worker, ["--topology", topology])
    env = two_host_env()
    traffic = BackgroundTraffic(
        hosts.addresses,
        TRAFFIC_PORT,
        args.flows,
        [hosts.exec_prefix(0), hosts.exec_prefix(1)],
        rate=args.traffic_bytes,
    )
    schedule = ContentionSchedule(traffic, args.before, args.during)
    log(f"{label} ...")
    t0 = time.monotonic()
    try:
        results = run_group(
            argvs,
            [env, env],
            timeout_s=args.launch_timeout,
            on_line=schedule.on_line,
            cwd=str(REPO),
        )
    finally:
        traffic.close()
    records = [r for res in results for r in parse_results(res.lines)]
    failed = [
        f"launcher {i}: exit status {res.returncode}:\n{res.tail()}"
        for i, res in enumerate(results)
        if not res.ok
    ]
    if schedule.error is not None:
        failed.append(f"background traffic: {schedule.error}")
    if failed:
        raise RuntimeError(f"{label} failed: " + "\n".join(failed))
    summary = next(r for r in records if r["kind"] == "summary")
    steps = sorted((r for r in records if r["kind"] == "step"), key=lambda r: r["step"])
    log(f"{label}: {len(steps)} steps in {time.monotonic() - t0:.0f} s")
    for d in summary["decisions"]:
        log(f"  {d}")
    return {
        "label": label, "topology": topology, "adaptive": adaptive, "steps": steps,
        "batch_size": summary["batch_size"], "np": summary["np"], "gradient_bytes": summary["gradient_bytes"],
        "decisions": summary["decisions"], "traffic_on": traffic.started_at, "traffic_off": traffic.stopped_at,
    }  # fmt: skip


# --------------------------------------------------------------- report
def print_report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """A markdown table on stdout: throughput per phase and run, and the policy's decisions."""
    args = meta["args"]
    print(
        f"### Throughput under link contention, np={runs[0]['np']} on two hosts, link {args['link']}\n"
    )
    print(
        "Samples/s (all workers); in brackets, relative to the same run before the traffic.\n"
    )
    print("| run | before | during | during, 2nd half | after | topology at the end |")
    print("|---|---:|---:|---:|---:|---|")
    for run in runs:
        s = summarize(run)
        t = s["throughput"]
        cells = [f"{t['before']:.1f}"]
        for key in ("during", "during_second_half", "after"):
            cells.append(f"{t[key]:.1f} ({t[key] / t['before']:.2f}×)")
        print(
            f"| {run['label']} | "
            + " | ".join(cells)
            + f" | {s['last_topology']['after']} |"
        )
    steps = summarize(runs[0])["steps"]
    print(
        f"\nSteps per phase: {steps['before']} before, {steps['during']} during, {steps['after']} after "
        f"({steps['transition']} overlapping the start or stop of the traffic, left out); global batch "
        f"{runs[0]['batch_size']}, {runs[0]['gradient_bytes'] / 1e6:.1f} MB of gradients per step, "
        f"background traffic {args['traffic']} per direction ('0': unpaced) on {args['flows']} TCP flows."
    )
    for run in runs:
        if run["adaptive"]:
            print(f"\n{run['label']} decisions:\n")
            for d in run["decisions"] or ["none"]:
                print(f"- {d}")
    print(
        f"\n_{meta['date']}, {meta['cpu_count']} cores (1-min load {meta['loadavg_start'][0]:.1f} at the start), "
        f"TF {meta['tensorflow']}, intra/inter-op 1 thread per worker_"
    )


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """Throughput against step for every run (5-step moving average), the contended steps shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for run in runs:
        steps = run["steps"]
        x = [s["step"] for s in steps]
        y = [run["batch_size"] / (s["end"] - s["start"]) for s in steps]
        smooth = [
            sum(y[max(0, i - 4) : i + 1]) / len(y[max(0, i - 4) : i + 1])
            for i in range(len(y))
        ]
        (line,) = ax.plot(x, smooth, label=run["label"])
        ax.plot(x, y, color=line.get_color(), alpha=0.2, linewidth=0.8)
        if run["adaptive"]:
            for prev, s in itertools.pairwise(steps):
                if s["topology"] != prev["topology"]:
                    ax.axvline(
                        s["step"], color=line.get_color(), linestyle=":", linewidth=0.8
                    )
                    ax.annotate(s["topology"], (s["step"], max(y) * 0.98), rotation=90, fontsize=7,
                                va="top", ha="right", color=line.get_color())  # fmt: skip
    contended = [
        s["step"]
        for s in runs[0]["steps"]
        if phase_of(s["start"], s["end"], runs[0]["traffic_on"], runs[0]["traffic_off"])
        != "before"
    ]
    ends = [s["step"] for s in runs[0]["steps"] if s["start"] >= runs[0]["traffic_off"]]
    if contended and ends:
        ax.axvspan(
            contended[0], ends[0], color="grey", alpha=0.15, label="background traffic"
        )
    ax.set_xlabel("step")
    ax.set_ylabel("samples/s (all workers; 5-step mean)")
    ax.set_title(
        "Throughput under link contention: static topology vs AdaptiveTopologyPolicy"
    )
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Runs every run of ``--runs`` on the same two hosts, prints the report, writes JSON and the plot."""
    args = parse_args(argv)
    if args.report is not None:
        saved = json.loads(args.report.read_text())
        print_report(saved["runs"], saved["meta"])
        plot(saved["runs"], args.plot)
        return 0
    # A SIGTERM must still run the finally below, or the namespaces outlive us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    meta = {**machine_metadata(), "args": {k: str(v) for k, v in vars(args).items()}}
    hosts, why = make_limited_hosts(SUBNET, "kfa", rate=args.link)
    if hosts is None:
        log(f"cannot emulate two hosts: {why}")
        return 1
    try:
        runs = [
            launch(topology, adaptive, hosts, args) for topology, adaptive in args.runs
        ]
    finally:
        hosts.destroy()
    meta["loadavg_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print_report(runs, meta)
    plot(runs, args.plot)
    log(f"raw results in {args.json}, plot in {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
