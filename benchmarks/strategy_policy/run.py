"""StrategyPolicy under a throttled link (issue 24 §3): the policy against every candidate strategy held static.

4 workers (``--np``) on two emulated hosts (network namespaces, 2 workers
each, a ``tc`` tbf link of ``--fast`` between them, see
benchmarks/harness/hosts.py) train the comm-heavy MLP
(benchmarks/strategy_policy/worker.py) for a fixed number of steps. After
``--before`` steps the benchmark throttles the inter-host link to ``--slow``
(``tc qdisc replace`` on both ends), and restores ``--fast`` ``--during``
steps later; ``--after`` steps follow. The runs: ``StrategyPolicy`` over
``--candidates`` (starting on the first; trials when a link's rate moves by
more than ``--link-change``), then each candidate static.

Why the best strategy changes with the link: with 2 workers per host, the
parameter-server builders send every gradient to its owner and back, 1.5×
what a ring all-reduce moves across the link (benchmarks/strategies), but
all-reduce costs more CPU per byte on this 2-core machine. A fast link makes
the CPU the bottleneck, a slow one the link.

Steps are assigned to phases by their wall-clock times against the moments
the link was throttled and restored (a step overlapping either moment is a
"transition" step and left out; benchmarks/adaptive_topology/run.py). The
report gives, per run and phase, the median step time and the throughput
(samples/s, all workers: the phase's samples over its steps' wall time, the
policy's trials included), the policy against the best static run of each
phase, when the policy switched, and whether every worker ran the same
strategy at every step (raw records in ``--json``).

    .venv/bin/python -m benchmarks.strategy_policy            # ~6 min, root
    .venv/bin/python -m benchmarks.strategy_policy --report build/bench/strategy_policy.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.adaptive_topology.run import (
    PHASES,
    TRANSITION,
    ContentionSchedule,
    phase_of,
    throughput,
)
from benchmarks.harness.cli import comma_choices
from benchmarks.harness.hosts import (
    LATENCY,
    TwoHosts,
    make_limited_hosts,
    set_link_rate,
    two_host_commands,
    two_host_env,
)
from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import BUILD_DIR, REPO
from benchmarks.harness.proc import log, run_group
from benchmarks.harness.timing import parse_results
from kungfu_tf.strategy.builders import BUILDERS

EXP_DIR = Path(__file__).resolve().parent
SUBNET = "10.221.0"  # the emulated hosts' /24; no test or other benchmark uses it
POLICY = "StrategyPolicy"


class LinkThrottle:
    """Throttles the inter-host link to ``slow`` at ``start()`` and restores ``fast`` at ``stop()``.

    What ``ContentionSchedule`` switches at the reported steps (the same
    interface as the adaptive-topology benchmark's background traffic);
    ``started_at`` and ``stopped_at`` are the wall-clock moments the rates
    took effect, the phase boundaries.
    """

    def __init__(self, hosts: TwoHosts, slow: str, fast: str, latency: str):
        self.hosts, self.slow, self.fast, self.latency = hosts, slow, fast, latency
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    def start(self) -> None:
        set_link_rate(self.hosts, self.slow, latency=self.latency)
        self.started_at = time.time()

    def stop(self) -> None:
        set_link_rate(self.hosts, self.fast, latency=self.latency)
        self.stopped_at = time.time()


# --------------------------------------------------------------- phases
def phase_steps(run: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rank 0's step records of ``run`` by phase (and the transition steps), in step order."""
    by_phase: dict[str, list[dict[str, Any]]] = {p: [] for p in (*PHASES, TRANSITION)}
    for s in run["steps"]:
        by_phase[phase_of(s["start"], s["end"], run["throttled_at"], run["restored_at"])].append(s)
    return by_phase


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """Per phase: steps, median step time (s), throughput (samples/s), strategies run; and the switches.

    Example (made-up steps of 1 s, then 2 s under the throttle; batch 10):

        >>> steps = [{"step": i, "start": i, "end": i + 1, "strategy": "PS"} for i in range(3)]
        >>> steps += [{"step": 3 + i, "start": 3 + 2 * i, "end": 5 + 2 * i, "strategy": "AllReduce"} for i in range(2)]
        >>> s = summarize({"steps": steps, "batch_size": 10, "throttled_at": 3, "restored_at": 6})
        >>> s["median_step"]["before"], s["throughput"]["before"], s["strategies"]["during"]
        (1, 10.0, ['AllReduce'])
        >>> s["switches"]
        [{'step': 3, 'phase': 'during', 'from': 'PS', 'to': 'AllReduce'}]
    """
    by_phase = phase_steps(run)
    phase_of_step = {s["step"]: p for p, steps in by_phase.items() for s in steps}
    switches = [
        {"step": s["step"], "phase": phase_of_step[s["step"]], "from": prev["strategy"], "to": s["strategy"]}
        for prev, s in itertools.pairwise(run["steps"])
        if s["strategy"] != prev["strategy"]
    ]
    return {
        "steps": {p: len(v) for p, v in by_phase.items()},
        "median_step": {p: statistics.median(s["end"] - s["start"] for s in by_phase[p]) if by_phase[p] else math.nan
                        for p in PHASES},
        "throughput": {p: throughput(by_phase[p], run["batch_size"]) for p in PHASES},
        # The second half of the throttled steps: after the policy's trials and switch, where it had time to settle.
        "during_second_half": throughput(by_phase["during"][len(by_phase["during"]) // 2 :], run["batch_size"]),
        "strategies": {p: sorted({s["strategy"] for s in by_phase[p]}) for p in PHASES},
        "last_strategy": {p: by_phase[p][-1]["strategy"] if by_phase[p] else None for p in PHASES},
        "switches": switches,
    }  # fmt: skip


def agreement(summaries: Sequence[dict[str, Any]]) -> bool:
    """Whether every rank ran the same strategy at every step and logged the same decisions.

    Example:
        >>> agreement([{"strategies": ["PS", "AllReduce"], "decisions": ["d"]}] * 2)
        True
        >>> agreement([{"strategies": ["PS"], "decisions": []}, {"strategies": ["AllReduce"], "decisions": []}])
        False
    """
    first = summaries[0]
    return all(s["strategies"] == first["strategies"] and s["decisions"] == first["decisions"] for s in summaries)


# --------------------------------------------------------------- running
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--candidates", default="PSLoadBalancing,AllReduce",
                   help="comma-separated builders; the policy starts on the first (default %(default)s)")
    p.add_argument("--np", type=int, default=4, help="workers (even; half per host)")
    p.add_argument("--fast", default="1gbit", help="the link's rate before and after, tc units (default %(default)s)")
    p.add_argument("--slow", default="100mbit", help="the throttled link's rate (default %(default)s)")
    p.add_argument("--latency", default=LATENCY, help="how long tbf queues before it drops (default %(default)s)")
    p.add_argument("--input-dim", type=int, default=512, help="the MLP's input width")
    p.add_argument("--hidden", default="1024,1024", help="the MLP's hidden widths (default %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (default %(default)s)")
    p.add_argument("--before", type=int, default=24, help="steps before the throttle")
    p.add_argument("--during", type=int, default=36, help="steps throttled")
    p.add_argument("--after", type=int, default=30, help="steps after it")
    p.add_argument("--link-change", type=float, default=0.5, help="StrategyPolicy(link_change=)")
    p.add_argument("--window", type=int, default=6, help="StrategyPolicy(window=)")
    p.add_argument("--trial-steps", type=int, default=3, help="StrategyPolicy(trial_steps=)")
    p.add_argument("--settle-steps", type=int, default=1, help="StrategyPolicy(settle_steps=)")
    p.add_argument("--min-gain", type=float, default=0.1, help="StrategyPolicy(min_gain=)")
    p.add_argument("--no-static", action="store_true", help="the policy's run only (no static runs)")
    p.add_argument("--launch-timeout", type=float, default=600.0, help="kill a run after this (s)")
    p.add_argument("--json", type=Path, default=BUILD_DIR / "strategy_policy.json", help="raw results")
    p.add_argument("--report", type=Path, metavar="JSON", help="report an earlier run's raw results")
    args = p.parse_args(argv)
    args.candidates = comma_choices(p, "--candidates", args.candidates, list(BUILDERS), allow_all=False)
    if len(args.candidates) < 2:
        p.error(f"--candidates: give at least 2 builders to choose between, got {args.candidates}")
    if args.np < 2 or args.np % 2:
        p.error(f"--np must be even and at least 2 (half the workers on each host), got {args.np}")
    for name in ("before", "during", "after"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def launch(strategy: str, policy: bool, hosts: TwoHosts, args: argparse.Namespace) -> dict[str, Any]:
    """One job, the link fast, throttled and fast again; its step records, phase moments and rank summaries."""
    label = f"{POLICY} (starts on {strategy})" if policy else f"static {strategy}"
    worker = [
        sys.executable, str(EXP_DIR / "worker.py"), "--run", label, "--strategy", strategy,
        "--steps", str(args.before + args.during + args.after), "--batch-size", str(args.batch_size),
        "--input-dim", str(args.input_dim), "--hidden", args.hidden, "--link-change", str(args.link_change),
        "--window", str(args.window), "--trial-steps", str(args.trial_steps),
        "--settle-steps", str(args.settle_steps), "--min-gain", str(args.min_gain),
    ]  # fmt: skip
    if policy:
        worker += ["--candidates", ",".join(args.candidates)]
    set_link_rate(hosts, args.fast, latency=args.latency)  # every run starts on the fast link
    throttle = LinkThrottle(hosts, args.slow, args.fast, args.latency)
    schedule = ContentionSchedule(throttle, args.before, args.during, what=f"link throttle to {args.slow}")  # type: ignore[arg-type]
    env = two_host_env()
    log(f"{label} ...")
    t0 = time.monotonic()
    results = run_group(two_host_commands(hosts, args.np, worker), [env, env], timeout_s=args.launch_timeout,
                        on_line=schedule.on_line, cwd=str(REPO))  # fmt: skip
    failed = [f"launcher {i}: exit status {r.returncode}:\n{r.tail()}" for i, r in enumerate(results) if not r.ok]
    if schedule.error is not None:
        failed.append(f"link throttle: {schedule.error}")
    if not failed and (throttle.started_at is None or throttle.stopped_at is None):
        failed.append("the link was not throttled and restored: rank 0 did not report the steps")
    if failed:
        raise RuntimeError(f"{label} failed: " + "\n".join(failed))
    records = [r for res in results for r in parse_results(res.lines)]
    summaries = sorted((r for r in records if r["kind"] == "summary"), key=lambda r: r["rank"])
    if [s["rank"] for s in summaries] != list(range(args.np)):
        raise RuntimeError(f"{label}: summaries from ranks {[s['rank'] for s in summaries]}, expected all {args.np}")
    steps = sorted((r for r in records if r["kind"] == "step"), key=lambda r: r["step"])
    log(f"{label}: {len(steps)} steps in {time.monotonic() - t0:.0f} s")
    for d in summaries[0]["decisions"]:
        log(f"  {d}")
    return {
        "label": label, "strategy": strategy, "policy": policy, "steps": steps, "np": args.np,
        "batch_size": args.batch_size, "gradient_bytes": summaries[0]["gradient_bytes"],
        "throttled_at": throttle.started_at, "restored_at": throttle.stopped_at,
        "decisions": summaries[0]["decisions"], "ranks_agree": agreement(summaries),
        "rank_strategies": [s["strategies"] for s in summaries], "switch_seconds": summaries[0]["switch_seconds"],
    }  # fmt: skip


# --------------------------------------------------------------- report
def best_static(runs: list[dict[str, Any]], phase: str) -> dict[str, Any] | None:
    """The static run with the highest throughput in ``phase`` (None without static runs)."""
    static = [r for r in runs if not r["policy"] and not math.isnan(summarize(r)["throughput"][phase])]
    return max(static, key=lambda r: summarize(r)["throughput"][phase], default=None)


def print_report(runs: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Markdown tables on stdout: each run per phase, the policy against the best static run, its switches."""
    args = meta["args"]
    first = runs[0]
    print(f"### StrategyPolicy under a throttled link, np={first['np']} on two hosts, "
          f"link {args['fast']} -> {args['slow']} -> {args['fast']}\n")  # fmt: skip
    print("Median step time (ms) and throughput (samples/s, all workers, the phase's samples over its wall time).\n")
    print("| run | before | during | during, 2nd half | after | strategy at the end of each phase |")
    print("|---|---:|---:|---:|---:|---|")
    for run in runs:
        s = summarize(run)
        cells = [f"{1e3 * s['median_step'][p]:.0f} ms, {s['throughput'][p]:.1f}/s" for p in PHASES]
        cells.insert(2, f"{s['during_second_half']:.1f}/s")
        last = " / ".join(str(s["last_strategy"][p]) for p in PHASES)
        print(f"| {run['label']} | " + " | ".join(cells) + f" | {last} |")
    policy_runs = [r for r in runs if r["policy"]]
    if policy_runs and any(not r["policy"] for r in runs):
        print("\nThe policy against the best static strategy of each phase (throughput ratio; 1.00 = as fast):\n")
        print("| phase | best static | its samples/s | policy's samples/s | policy / best |")
        print("|---|---|---:|---:|---:|")
        for phase in (*PHASES, "during_second_half"):
            key = "during" if phase == "during_second_half" else phase
            best = best_static(runs, key)
            assert best is not None
            want, got = (summarize(r)["throughput"] if phase in PHASES else {phase: summarize(r)[phase]}
                         for r in (best, policy_runs[0]))  # fmt: skip
            print(f"| {phase.replace('_', ' ')} | {best['strategy']} | {want[phase]:.1f} | {got[phase]:.1f} | "
                  f"{got[phase] / want[phase]:.2f} |")  # fmt: skip
    steps = summarize(first)["steps"]
    print(f"\nSteps per phase: {steps['before']} before, {steps['during']} during, {steps['after']} after "
          f"({steps['transition']} overlapping the throttle or its end, left out); global batch "
          f"{first['batch_size']}, {first['gradient_bytes'] / 1e6:.1f} MB of gradients per step.")  # fmt: skip
    for run in policy_runs:
        print(f"\n{run['label']}: switches (step: from -> to, phase; the trials' own switches included):\n")
        for sw in summarize(run)["switches"] or [{"step": "-", "from": "none", "to": "", "phase": ""}]:
            print(f"- step {sw['step']}: {sw['from']} -> {sw['to']} ({sw['phase']})")
        print(f"\nDecisions (every worker ran the same strategy at every step and logged the same: "
              f"{'yes' if run['ranks_agree'] else 'NO'}):\n")  # fmt: skip
        for d in run["decisions"] or ["none"]:
            print(f"- {d}")
        costs = [f"{sw['old']} -> {sw['new']} {sw['agree'] + sw['gather'] + sw['rebuild']:.2f} s "
                 f"(slot gather {sw['gather']:.2f} s)" for sw in run.get("switch_seconds", [])]  # fmt: skip
        print(f"\nEach switch on rank 0 (SwitchReport): {'; '.join(costs) or 'none'}.")
    load = meta["loadavg_start"]
    print(f"\n_{meta['date']}, {meta['cpu_count']} cores, load average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} "
          f"at the start, {', '.join(f'{v:.2f}' for v in meta.get('loadavg_end', []))} at the end; "
          f"TF {meta['tensorflow']}, intra/inter-op 1 thread per worker_")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Runs the policy and every static candidate on the same two hosts, prints the report, writes JSON."""
    args = parse_args(argv)
    if args.report is not None:
        saved = json.loads(args.report.read_text())
        print_report(saved["runs"], saved["meta"])
        return 0
    # A SIGTERM must still run the finally below, or the namespaces outlive us.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    meta = {**machine_metadata(), "args": {k: str(v) for k, v in vars(args).items()}}
    hosts, why = make_limited_hosts(SUBNET, "kfp", rate=args.fast, latency=args.latency)
    if hosts is None:
        log(f"cannot emulate two hosts: {why}")
        return 1
    try:
        plan = [(args.candidates[0], True)] + ([] if args.no_static else [(c, False) for c in args.candidates])
        runs = [launch(strategy, policy, hosts, args) for strategy, policy in plan]
    finally:
        hosts.destroy()
    meta["loadavg_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    print_report(runs, meta)
    log(f"raw results in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
