"""Adaptive-training experiments (``make bench-adaptive``): one subcommand per experiment.

    .venv/bin/python benchmarks/adaptive_batch.py                 # every experiment
    .venv/bin/python benchmarks/adaptive_batch.py batch-size --np 4 --epochs 4

``batch-size`` (KungFu §6.2 (1), Taming §4, Fig. 5): time-to-accuracy and
final accuracy of ``GNSBatchSizePolicy`` against a static small and a static
large global batch, on scikit-learn's digits enlarged by seeded augmentation
(benchmarks/digits_augmented.py; the held-out set is the real test split),
the same MLP, SGD with momentum and learning-rate rule (square root of the
batch ratio) and the same number of epochs in all three runs, each with
``--np`` workers on this machine (adaptive_batch_worker.py). The target
accuracy is the small batch's final accuracy minus ``--margin``; the time to
reach it counts training only (rank 0 pauses its clock to evaluate).
Prints a markdown table, writes the records as JSON (build/bench/) and a
PNG plot of accuracy and batch size against training time
(benchmarks/results/adaptive_batch.png by default; the table next to it, .md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench_meta import machine_metadata
from bench_proc import run_group
from bench_timing import parse_results

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
BUILD_DIR = REPO / "build" / "bench"
RESULTS_DIR = BENCH_DIR / "results"
WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
MODES = ("small", "large", "adaptive")
LABELS = {"small": "static small batch", "large": "static large batch", "adaptive": "GNSBatchSizePolicy"}


def log(msg: str) -> None:
    print(f"[bench-adaptive] {msg}", file=sys.stderr, flush=True)


def worker_env() -> dict[str, str]:
    """benchmarks/ and this checkout first on the workers' import path."""
    env = dict(os.environ, **WORKER_ENV)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(BENCH_DIR), str(REPO)] + ([path] if path else []))
    return env


# --------------------------------------------------------------------------- analysis
def time_to_accuracy(records: Sequence[dict[str, Any]], target: float) -> float | None:
    """Training seconds at the first evaluation reaching ``target``, or None if none did.

    Example:
        >>> time_to_accuracy([{"time_s": 0, "accuracy": 0.1}, {"time_s": 5, "accuracy": 0.9}], 0.85)
        5
    """
    for r in records:
        if r["accuracy"] >= target:
            return r["time_s"]
    return None


def summary_rows(runs: dict[str, dict[str, Any]], margin: float) -> tuple[float, list[dict[str, Any]]]:
    """(target accuracy, one row per mode): final accuracy, training time, time to target, speed-up vs small."""
    target = runs["small"]["records"][-1]["accuracy"] - margin
    small_tta = time_to_accuracy(runs["small"]["records"], target)
    rows = []
    for mode in MODES:
        if mode not in runs:
            continue
        recs = runs[mode]["records"]
        tta = time_to_accuracy(recs, target)
        at_first = [r for r in recs if r["batch_size"] == recs[0]["batch_size"] and r["step"] > 0]
        rows.append({
            "mode": mode,
            "batch": f"{recs[0]['batch_size']}" if recs[0]["batch_size"] == recs[-1]["batch_size"]
            else f"{recs[0]['batch_size']} -> {recs[-1]['batch_size']}",
            "final_accuracy": recs[-1]["accuracy"],
            "best_accuracy": max(r["accuracy"] for r in recs),
            "train_time_s": recs[-1]["time_s"],
            "steps": recs[-1]["step"],
            # Mean step time while the first batch size held (shows the monitoring and policy cost at 64).
            "first_batch_step_ms": 1000 * at_first[-1]["time_s"] / at_first[-1]["step"] if at_first else None,
            "time_to_target_s": tta,
            "speedup_vs_small": None if tta is None or small_tta is None or tta == 0 else small_tta / tta,
        })  # fmt: skip
    return target, rows


def markdown_table(target: float, rows: Sequence[dict[str, Any]]) -> str:
    head = ["run", "global batch", "steps", "ms/step at first batch", "training time", f"time to {target:.1%}",
            "vs small", "final acc.", "best acc."]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tta = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
        speed = "" if r["speedup_vs_small"] is None else f"{r['speedup_vs_small']:.2f}x"
        step_ms = "" if r["first_batch_step_ms"] is None else f"{r['first_batch_step_ms']:.1f}"
        lines.append(f"| {LABELS[r['mode']]} | {r['batch']} | {r['steps']} | {step_ms} | {r['train_time_s']:.1f} s | {tta} | "
                     f"{speed} | {r['final_accuracy']:.1%} | {r['best_accuracy']:.1%} |")  # fmt: skip
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, Any]], target: float, path: Path, title: str) -> None:
    """Accuracy (top) and global batch size (bottom, log scale) against training time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"small": "tab:blue", "large": "tab:orange", "adaptive": "tab:green"}
    fig, (acc_ax, batch_ax) = plt.subplots(2, 1, sharex=True, figsize=(7, 6), height_ratios=[2, 1])
    for mode in MODES:
        if mode not in runs:
            continue
        recs = runs[mode]["records"]
        t = [r["time_s"] for r in recs]
        acc_ax.plot(t, [100 * r["accuracy"] for r in recs], color=colors[mode], label=LABELS[mode])
        batch_ax.step(t, [r["batch_size"] for r in recs], where="post", color=colors[mode], label=LABELS[mode])
    acc_ax.axhline(100 * target, color="gray", linestyle="--", linewidth=1, label=f"target {target:.1%}")
    acc_ax.set_ylabel("held-out accuracy (%)")
    acc_ax.set_ylim(max(0, 100 * target - 25), 100)
    acc_ax.legend(loc="lower right")
    acc_ax.set_title(title, fontsize=10)
    batch_ax.set_yscale("log", base=2)
    batch_ax.set_ylabel("global batch size")
    batch_ax.set_xlabel("training time (s, evaluation excluded)")
    for ax in (acc_ax, batch_ax):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- batch-size
def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "kungfu_tf.run", "-np", str(args.np),
        sys.executable, str(BENCH_DIR / "adaptive_batch_worker.py"), "--mode", mode,
        "--small-batch", str(args.small_batch), "--large-batch", str(args.large_batch),
        "--epochs", str(args.epochs), "--copies", str(args.copies), "--lr", str(args.lr), "--hidden", str(args.hidden),
        "--gns-every", str(args.gns_every), "--gns-threshold", str(args.gns_threshold),
        "--eval-every", str(args.eval_every), "--seed", str(args.seed),
    ]  # fmt: skip
    log(f"{mode}: {args.np} workers ...")
    t0 = time.monotonic()
    echo = (lambda i, line: print(line, file=sys.stderr, flush=True)) if args.verbose else None
    (res,) = run_group([argv], [worker_env()], timeout_s=args.launch_timeout, on_line=echo, cwd=str(REPO))
    found = [r for r in parse_results(res.lines) if r.get("mode") == mode]
    if not res.ok or not found:
        raise RuntimeError(f"{mode} run failed (exit status {res.returncode}):\n{res.tail(40)}")
    for change in found[0]["changes"]:
        log(f"  {change}")
    log(f"{mode}: done in {time.monotonic() - t0:.0f} s (launch included)")
    return found[0]


def batch_size_experiment(args: argparse.Namespace) -> int:
    runs = {mode: run_mode(mode, args) for mode in args.modes}
    if "small" not in runs:
        raise SystemExit("the target accuracy comes from the small batch's run: include 'small' in --modes")
    target, rows = summary_rows(runs, args.margin)
    title = (f"digits (x{args.copies} augmented), MLP 64-{args.hidden}-{args.hidden}-10, {args.np} workers, "
             f"{args.epochs:g} epochs,\nSGD + momentum, lr {args.lr} x sqrt(B/{args.small_batch}) in every run")  # fmt: skip
    table = markdown_table(target, rows)
    print(f"\n{title.replace(chr(10), ' ')}; target = small batch's final accuracy - {args.margin:.1%}\n\n{table}\n", flush=True)
    plot(runs, target, Path(args.plot), title)
    load = os.getloadavg()
    Path(args.plot).with_suffix(".md").write_text(
        f"{title.replace(chr(10), ' ')}; target = small batch's final accuracy - {args.margin:.1%}; "
        f"load average at the end {load[0]:.1f} on {os.cpu_count()} cores (`make bench-adaptive`)\n\n{table}\n"
    )
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    out = BUILD_DIR / "adaptive_batch.json"
    out.write_text(json.dumps({"meta": machine_metadata(), "args": vars(args), "target": target, "rows": rows,
                               "runs": runs}, indent=1, default=str))  # fmt: skip
    log(f"plot: {args.plot}; records: {out}")
    return 0


def add_batch_size_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--np", type=int, default=4, help="workers per run")
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES), help="comma-separated subset of "
                   + ",".join(MODES))  # fmt: skip
    p.add_argument("--small-batch", type=int, default=64, help="global")
    p.add_argument("--large-batch", type=int, default=1024, help="global; also the policy's maximum")
    p.add_argument("--epochs", type=float, default=5.0)
    p.add_argument("--copies", type=int, default=16, help="augmented copies of each training image")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at the small batch")
    p.add_argument("--hidden", type=int, default=1024, help="width of the MLP's two hidden layers")
    p.add_argument("--gns-every", type=int, default=20)
    p.add_argument("--gns-threshold", type=float, default=1.5)
    p.add_argument("--eval-every", type=int, default=4096, help="samples between evaluations")
    p.add_argument("--margin", type=float, default=0.01, help="target = small batch's final accuracy - margin")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--plot", default=str(RESULTS_DIR / "adaptive_batch.png"))
    p.add_argument("--launch-timeout", type=float, default=400.0)
    p.add_argument("--verbose", action="store_true", help="echo the workers' output")


# Subcommand -> (add its arguments, run it). Further experiments register here.
EXPERIMENTS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {
    "batch-size": (add_batch_size_args, batch_size_experiment),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="experiment")
    for name, (add_args, _) in EXPERIMENTS.items():
        add_args(sub.add_parser(name))
    args = p.parse_args(argv)
    names = [args.experiment] if args.experiment else list(EXPERIMENTS)
    status = 0
    for name in names:
        add_args, run = EXPERIMENTS[name]
        # Without a subcommand every experiment runs on its defaults.
        exp_args = args if args.experiment else _defaults(add_args)
        status |= run(exp_args)
    return status


def _defaults(add_args: Callable[[argparse.ArgumentParser], None]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_args(p)
    return p.parse_args([])


if __name__ == "__main__":
    sys.exit(main())
