"""The cost of completing a parameter-server step on every rank (``make bench-step-completion``).

A step under a strategy with parameter servers waits, before its update and
its optimizer's step counter, for one 4-byte all-reduce entered after every
rank's part of the synchronisation (``StrategyPlan._completed_everywhere``),
so that a step a lost peer fails changes nothing anywhere. This measures that
wait: the same step with and without it in one job (``worker.py``), for each
``--np`` and model, on this machine's loopback, and prints a table (median
step time of alternating timed blocks; the ratio is the cost).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import REPO
from benchmarks.harness.proc import log, run_group, worker_env

WORKER = Path(__file__).resolve().parent / "worker.py"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", default="2,4", help="comma-separated worker counts")
    p.add_argument("--models", default="128;1024,1024", help="';'-separated hidden widths of the MLPs")
    p.add_argument("--strategy", default="PS", help="a builder with parameter servers")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--json", type=Path, default=REPO / "build" / "bench" / "step_completion.json")
    return p.parse_args(argv)


def measure(np_: int, hidden: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", "kungfu_tf.run", "-np", str(np_), sys.executable, str(WORKER),
            "--strategy", args.strategy, "--hidden", hidden, "--rounds", str(args.rounds),
            "--steps", str(args.steps)]  # fmt: skip
    [done] = run_group([argv], [worker_env()], timeout_s=900)
    results = [line.split("RESULT ", 1)[1] for line in done.lines if "RESULT " in line]
    if not done.ok or not results:
        raise RuntimeError(f"np={np_} hidden={hidden}: exit {done.returncode}\n{done.tail()}")
    return json.loads(results[-1])


def table(rows: list[dict]) -> str:
    out = ["| np | model (hidden) | with the wait | without | with ÷ without |", "|---:|---|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['np']} | 64-{'-'.join(map(str, r['hidden']))}-10 | {r['with_s'] * 1e3:.3f} ms | "
                   f"{r['without_s'] * 1e3:.3f} ms | {r['with_s'] / r['without_s']:.3f} |")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta = machine_metadata()
    rows = []
    for np_ in (int(n) for n in args.np.split(",")):
        for hidden in args.models.split(";"):
            log(f"np={np_} hidden={hidden} ...")
            rows.append(measure(np_, hidden, args))
    print(f"### A parameter-server step completed on every rank ({args.strategy}, Adam, loopback)\n")
    print(table(rows))
    print(f"\n_{meta['date']}, {meta['cpu_count']} cores, load average at the start "
          f"{', '.join(f'{v:.2f}' for v in meta['loadavg_start'])}; TF {meta['tensorflow']}_")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0
