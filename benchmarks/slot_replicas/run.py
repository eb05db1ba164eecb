"""What replicating parameter servers' optimizer slots costs an elastic job (``make bench-slot-replicas``).

In an elastic job every rank keeps a replica of each synchronous parameter
server's optimizer slots, which the owner publishes after each update
(``StrategyPlan.keep_slot_replicas``), so that a SIGKILLed owner's slots
survive. This measures the step with and without it (``KUNGFU_SLOT_REPLICAS=0``)
in one run: ``models/elastic_train.py`` under ``kungfu-run --elastic``, a
custom loop, SGD with momentum or Adam, for each strategy, the two settings
alternating over ``--rounds`` jobs (the order rotated each round), and prints
the median step time of each (the first ``--skip`` steps of a job left out)
and their ratio. ``--staleness K`` (-1: asynchronous) makes the parameter
servers stale: the owner saves its slots beside its value and the others
fetch them with it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import REPO
from benchmarks.harness.proc import log, run_group, worker_env

SCRIPT = REPO / "models" / "elastic_train.py"
SETTINGS = {"replicas": "1", "no replicas": "0"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--np", type=int, default=3)
    p.add_argument("--strategies", default="PS,PSLoadBalancing,PartitionedPS")
    p.add_argument("--optimizers", default="momentum,adam")
    p.add_argument("--hidden", type=int, default=512, help="width of the MLP's hidden layer")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip", type=int, default=10, help="first steps of each job not timed (trace, AUTO's probe)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--staleness", type=int, default=None, help="stale parameter servers (K; -1: asynchronous)")
    p.add_argument("--json", type=Path, default=REPO / "build" / "bench" / "slot_replicas.json")
    args = p.parse_args(argv)
    if args.np < 2 or args.steps <= args.skip + 2 or args.rounds < 1:
        p.error("--np must be >= 2, --steps > --skip + 2 and --rounds >= 1")
    return args


def step_times(strategy: str, optimizer: str, setting: str, args: argparse.Namespace) -> list[float]:
    """Rank 0's step times (s) of one job, the first ``--skip`` left out."""
    with tempfile.TemporaryDirectory() as records:
        argv = [sys.executable, "-m", "kungfu_tf.run", "--elastic", "--max-np", str(args.np), "-np", str(args.np),
                "-q", sys.executable, str(SCRIPT), "--api", "function", "--strategy", strategy, "--optimizer",
                optimizer, "--hidden", str(args.hidden), "--samples", str(64 * args.np * args.steps),
                "--batch-size", "64", "--steps", str(args.steps), "--epochs", "100", "--record-dir", records]  # fmt: skip
        if args.staleness is not None:
            argv += ["--staleness", str(args.staleness)]
        [done] = run_group([argv], [worker_env({"KUNGFU_SLOT_REPLICAS": SETTINGS[setting]})], timeout_s=600)
        if not done.ok:
            raise RuntimeError(f"{strategy} {optimizer} {setting}: exit {done.returncode}\n{done.tail()}")
        steps = []
        for path in Path(records).glob("*.jsonl"):
            for line in path.read_text().splitlines():
                r = json.loads(line)
                if r.get("event") == "step" and r.get("rank") == 0 and r["step"] >= args.skip:
                    steps.append(r["t1"] - r["t0"])
        return steps


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    meta = machine_metadata()
    rows = []
    order = list(SETTINGS)
    for strategy in args.strategies.split(","):
        for optimizer in args.optimizers.split(","):
            times: dict[str, list[float]] = {s: [] for s in SETTINGS}
            for k in range(args.rounds):
                for setting in order[k % 2 :] + order[: k % 2]:
                    log(f"{strategy} {optimizer} {setting}, round {k + 1} ...")
                    times[setting] += step_times(strategy, optimizer, setting, args)
            med = {s: statistics.median(ts) for s, ts in times.items()}
            rows.append({"strategy": strategy, "optimizer": optimizer, **{f"{s}_s": v for s, v in med.items()},
                         "steps": {s: len(ts) for s, ts in times.items()}})  # fmt: skip
    kind = "" if args.staleness is None else (" (asynchronous)" if args.staleness < 0 else f" (staleness {args.staleness})")
    print(f"## Replicas of parameter servers'{kind} optimizer slots, np={args.np}, MLP 64-{args.hidden}-10, "
          f"elastic custom loop\n")
    print("| strategy | optimizer | with replicas | without | with ÷ without |\n|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['strategy']} | {r['optimizer']} | {r['replicas_s'] * 1e3:.2f} ms | {r['no replicas_s'] * 1e3:.2f} ms"
              f" | {r['replicas_s'] / r['no replicas_s']:.3f} |")  # fmt: skip
    print(f"\n_{meta['date']}, {meta['cpu_count']} cores, load average at the start "
          f"{', '.join(f'{v:.2f}' for v in meta['loadavg_start'])}; median step of rank 0, "
          f"{args.rounds} jobs per setting, {args.steps - args.skip} timed steps each_")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                    indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
