"""The cost of a membership change to a job trained with a strategy (issue 24 §2), side by side in one run.

For each ``--builders`` entry (and ``none``: plain S-SGD, whose step is never
traced again), one ``kungfu-run --elastic -np 3`` job of models/elastic_train.py
(``--api function``, SGD with momentum, the digits MLP) goes through
``--resize-at`` (default: shrink 3 -> 2 after 10 steps, grow back to 3 after 20,
``resize(3, wait=True)``) and records every step (``--record-dir``). From the
records of the worker of rank 0:

* **steady step**: the median duration of the steps not right after a change;
* **first step after a change**: the duration of the step right after it, which
  traces the step again when a strategy was re-built (kungfu_tf.elastic.function;
  plain S-SGD keeps its trace); the re-trace cost is its excess over the steady step;
* **change**: from the end of the last step before the change to the start
  of the first one after it (resize, agreement, the strategy's re-build and slot
  hand-over, the state sync; a growth also waits for the joiner's warm-up).

With ``--switches`` (default ``PSLoadBalancing:10:AllReduce,20:PartitionedPS``: start
with a strategy, then ``--switch-at``), one more job of the same model, without a
membership change, switches the strategy twice (``switch_strategy``); its table has
the same columns per switch, plus the switch itself as ``SwitchReport`` measured it
on rank 0 (agreement, slot gathering, the plan's re-build).

Prints markdown tables (copied to docs/guide/benchmarks.md) with the machine's
load (``uptime``) at the start and the end.

    .venv/bin/python -m benchmarks.strategy_resize                       # ~3-5 min on 2 cores
    .venv/bin/python -m benchmarks.strategy_resize --builders PSLoadBalancing --resize-at 10:2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BUILDERS = "none,AllReduce,PSLoadBalancing,PartitionedPS,Parallax"


def run_job(builder: str, resize_at: str, steps: int, record_dir: Path, timeout: float, switch_at: str = "") -> None:
    """One elastic job of models/elastic_train.py with ``builder`` (``none``: no strategy)."""
    cmd = [sys.executable, "-m", "kungfu_tf.run", "--elastic", "--max-np", "3", "-np", "3",
           sys.executable, str(REPO_ROOT / "models" / "elastic_train.py"), "--api", "function",
           "--optimizer", "momentum", "--lr", "0.05", "--steps", str(steps), "--epochs", "100",
           "--resize-at", resize_at, "--resize-wait", "--record-dir", str(record_dir)]  # fmt: skip
    if switch_at:
        cmd += ["--switch-at", switch_at]
    if builder != "none":
        cmd += ["--strategy", builder]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    done = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{builder}: the job failed (exit {done.returncode}):\n{done.stderr[-4000:]}")


def measure(record_dir: Path, event: str = "change") -> dict[str, Any]:
    """Steady step, first step after each change (``event``: "change" or "switch") and each one's gap, from rank
    0's records (seconds); for switches also ``switch``: each switch's own seconds (its SwitchReport) on rank 0."""
    steps: dict[int, tuple[float, float]] = {}
    changes: set[int] = set()
    switch_seconds: dict[int, float] = {}
    rank0 = set()
    for path in record_dir.glob("*.jsonl"):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        if any(r["event"] == "step" and r["rank"] == 0 for r in records):
            rank0.add(path)
        for r in records:
            if r["event"] == "step" and r["rank"] == 0:
                steps[r["step"]] = (r["t0"], r["t1"])
            elif r["event"] == event and not r.get("detached", False):
                changes.add(r["step"])
                if event == "switch" and path in rank0:
                    switch_seconds[r["step"]] = r["seconds"]
    after = sorted(s for s in changes if s in steps and s - 1 in steps)
    steady = [t1 - t0 for s, (t0, t1) in steps.items() if s not in after and s > 0]
    return {
        "steady": statistics.median(steady),
        "first_after": [steps[s][1] - steps[s][0] for s in after],
        "gap": [steps[s][0] - steps[s - 1][1] for s in after],
        "switch": [switch_seconds[s] for s in after if s in switch_seconds],
    }


def uptime() -> str:
    return subprocess.run(["uptime"], check=False, capture_output=True, text=True).stdout.strip()


def table(results: dict[str, dict[str, Any]]) -> str:
    ms = lambda xs: ", ".join(f"{1e3 * x:.0f}" for x in xs)
    rows = ["| strategy | steady step (ms) | first step after each change (ms) | re-trace cost (ms) | change (ms) |",
            "|---|---|---|---|---|"]  # fmt: skip
    for builder, m in results.items():
        extra = [x - m["steady"] for x in m["first_after"]]
        rows.append(f"| {builder} | {1e3 * m['steady']:.1f} | {ms(m['first_after'])} | {ms(extra)} | {ms(m['gap'])} |")
    return "\n".join(rows)


def switch_table(label: str, m: dict[str, Any]) -> str:
    """One row per switch job: the columns of :func:`table`, plus each switch's own time on rank 0."""
    ms = lambda xs: ", ".join(f"{1e3 * x:.0f}" for x in xs)
    extra = [x - m["steady"] for x in m["first_after"]]
    return "\n".join([
        ("| strategies | steady step (ms) | first step after each switch (ms) | re-trace cost (ms) | "
         "switch_strategy on rank 0 (ms) | between the steps (ms) |"),
        "|---|---|---|---|---|---|",
        f"| {label} | {1e3 * m['steady']:.1f} | {ms(m['first_after'])} | {ms(extra)} | {ms(m['switch'])} | {ms(m['gap'])} |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--builders", default=DEFAULT_BUILDERS, help="comma-separated builder names; none: no strategy")
    p.add_argument("--resize-at", default="10:2,20:3", help="models/elastic_train.py --resize-at")
    p.add_argument("--switches", default="PSLoadBalancing:10:AllReduce,20:PartitionedPS",
                   help="START:SWITCH_AT (models/elastic_train.py --switch-at); empty: no switch job")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    load_start = uptime()
    results = {}
    for builder in filter(None, args.builders.split(",")):
        with tempfile.TemporaryDirectory(prefix="strategy_resize_") as tmp:
            run_job(builder, args.resize_at, args.steps, Path(tmp), args.timeout)
            results[builder] = measure(Path(tmp))
        print(f"{builder}: {results[builder]}", flush=True)
    switched = None
    if args.switches:
        start, _, switch_at = args.switches.partition(":")
        with tempfile.TemporaryDirectory(prefix="strategy_switch_") as tmp:
            run_job(start, "", args.steps, Path(tmp), args.timeout, switch_at=switch_at)
            switched = measure(Path(tmp), event="switch")
        label = " → ".join([start] + [part.split(":")[1] for part in switch_at.split(",")])
        print(f"switches {label}: {switched}", flush=True)
    print(f"\nnp=3, --resize-at {args.resize_at}, digits MLP (64-32-10), SGD + momentum, --api function")
    print(f"load at start: {load_start}\nload at end:   {uptime()}\n")
    if results:
        print(table(results))
    if switched is not None:
        print(f"\nswitches (no membership change), --switch-at {switch_at}:\n")
        print(switch_table(label, switched))
    return 0
