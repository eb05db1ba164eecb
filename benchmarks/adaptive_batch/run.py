"""Adaptive-training experiments (``make bench-adaptive``): one subcommand per experiment.

    .venv/bin/python -m benchmarks.adaptive_batch                 # every experiment
    .venv/bin/python -m benchmarks.adaptive_batch batch-size --np 4 --epochs 4

``batch-size`` (KungFu §6.2 (1), Taming §4, Fig. 5; Pollux §3): time-to-
accuracy and final accuracy of ``GNSBatchSizePolicy`` and
``GoodputBatchSizePolicy`` against a static small and a static large global
batch, on scikit-learn's digits enlarged by seeded augmentation
(benchmarks/harness/digits_augmented.py; the held-out set is the real test split),
the same MLP and SGD with momentum in every run, each with ``--np`` workers
on this machine (benchmarks/adaptive_batch/worker.py), for each of ``--seeds``. Per
seed, the small batch trains ``--epochs`` epochs first; its training time is
the time budget of the other runs of that seed (``--same-epochs``: every run
trains ``--epochs`` instead), so that "final accuracy" compares what each
run reached in the same time. The target accuracy is the small batch's final
accuracy minus ``--margin``; the time to reach it counts training only (rank
0 pauses its clock to evaluate). Prints a markdown table per seed and one
over the seeds, writes the records as JSON (build/bench/) and a PNG plot of
accuracy and batch size against training time for the first seed
(benchmarks/results/adaptive_batch.png by default; the tables next to it, .md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import BUILD_DIR, REPO, RESULTS_DIR
from benchmarks.harness.proc import run_group
from benchmarks.harness.timing import parse_results

EXP_DIR = Path(__file__).resolve().parent
WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
MODES = ("small", "large", "adaptive", "goodput")
LABELS = {"small": "static small batch", "large": "static large batch", "adaptive": "GNSBatchSizePolicy",
          "goodput": "GoodputBatchSizePolicy"}  # fmt: skip


def log(msg: str) -> None:
    print(f"[bench-adaptive] {msg}", file=sys.stderr, flush=True)


def worker_env() -> dict[str, str]:
    """benchmarks/ and this checkout first on the workers' import path."""
    env = dict(os.environ, **WORKER_ENV)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([path] if path else []))
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
            "epochs": recs[-1]["samples"] / runs[mode]["train_samples"] if runs[mode].get("train_samples") else None,
            "steps": recs[-1]["step"],
            # Mean step time while the first batch size held (shows the monitoring and policy cost at 64).
            "first_batch_step_ms": 1000 * at_first[-1]["time_s"] / at_first[-1]["step"] if at_first else None,
            "time_to_target_s": tta,
            "speedup_vs_small": None if tta is None or small_tta is None or tta == 0 else small_tta / tta,
        })  # fmt: skip
    return target, rows


def markdown_table(target: float, rows: Sequence[dict[str, Any]]) -> str:
    head = ["run", "global batch", "steps", "ms/step at first batch", "training time", "epochs", f"time to {target:.1%}",
            "vs small", "final acc.", "best acc."]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tta = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
        speed = "" if r["speedup_vs_small"] is None else f"{r['speedup_vs_small']:.2f}x"
        step_ms = "" if r["first_batch_step_ms"] is None else f"{r['first_batch_step_ms']:.1f}"
        epochs = "" if r.get("epochs") is None else f"{r['epochs']:.1f}"
        lines.append(f"| {LABELS[r['mode']]} | {r['batch']} | {r['steps']} | {step_ms} | {r['train_time_s']:.1f} s | {epochs} | {tta} | "
                     f"{speed} | {r['final_accuracy']:.1%} | {r['best_accuracy']:.1%} |")  # fmt: skip
    return "\n".join(lines)


def seeds_table(per_seed: dict[int, tuple[float, list[dict[str, Any]]]]) -> str:
    """One row per mode over the seeds: median speed-up to the target, each seed's, and the final accuracy
    against the small batch's (mean and worst difference, in points)."""
    head = ["run", "seeds reaching the target", "median speed-up vs small", "speed-up per seed", "final acc. (mean)",
            "final acc. - small's, mean / worst (points)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for mode in MODES:
        rows = {seed: next((r for r in rows if r["mode"] == mode), None) for seed, (_, rows) in per_seed.items()}
        rows = {seed: r for seed, r in rows.items() if r is not None}
        if not rows:
            continue
        small = {seed: next(r for r in per_seed[seed][1] if r["mode"] == "small") for seed in rows}
        speeds = [r["speedup_vs_small"] for r in rows.values()]
        reached = [x for x in speeds if x is not None]
        diffs = [100 * (r["final_accuracy"] - small[seed]["final_accuracy"]) for seed, r in rows.items()]
        median = f"{statistics.median(x if x is not None else 0.0 for x in speeds):.2f}x" if reached else "not reached"
        per = ", ".join("not reached" if x is None else f"{x:.2f}x" for x in speeds)
        final = statistics.mean(r["final_accuracy"] for r in rows.values())
        lines.append(f"| {LABELS[mode]} | {len(reached)} of {len(rows)} | {median} | {per} | {final:.1%} | "
                     f"{statistics.mean(diffs):+.1f} / {min(diffs):+.1f} |")  # fmt: skip
    return "\n".join(lines)


def plot(runs: dict[str, dict[str, Any]], target: float, path: Path, title: str) -> None:
    """Accuracy (top) and global batch size (bottom, log scale) against training time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"small": "tab:blue", "large": "tab:orange", "adaptive": "tab:green", "goodput": "tab:red"}
    fig, (acc_ax, batch_ax) = plt.subplots(2, 1, sharex=True, figsize=(7, 6.4), height_ratios=[2, 1])
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
def run_mode(mode: str, args: argparse.Namespace, seed: int, budget_s: float = 0.0) -> dict[str, Any]:
    epochs = args.epochs if budget_s <= 0 else args.epochs * args.epochs_cap
    argv = [
        sys.executable, "-m", "kungfu_tf.run", "-np", str(args.np),
        sys.executable, str(EXP_DIR / "worker.py"), "--mode", mode,
        "--small-batch", str(args.small_batch), "--large-batch", str(args.large_batch),
        "--epochs", str(epochs), "--copies", str(args.copies), "--lr", str(args.lr), "--hidden", str(args.hidden),
        "--gns-every", str(args.gns_every), "--gns-threshold", str(args.gns_threshold),
        "--eval-every", str(args.eval_every), "--seed", str(seed), "--time-budget", str(budget_s),
    ]  # fmt: skip
    log(f"{mode} (seed {seed}): {args.np} workers{f', {budget_s:.1f} s of training' if budget_s > 0 else ''} ...")
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
    if "small" not in args.modes:
        raise SystemExit("the target accuracy comes from the small batch's run: include 'small' in --modes")
    all_runs: dict[int, dict[str, dict[str, Any]]] = {}
    per_seed: dict[int, tuple[float, list[dict[str, Any]]]] = {}
    for seed in args.seeds:
        runs = {"small": run_mode("small", args, seed)}
        budget = 0.0 if args.same_epochs else runs["small"]["records"][-1]["time_s"]
        runs.update((mode, run_mode(mode, args, seed, budget)) for mode in MODES if mode in args.modes and mode != "small")
        all_runs[seed] = runs
        per_seed[seed] = summary_rows(runs, args.margin)
    budget_text = ("every run trains the same epochs" if args.same_epochs
                   else f"every run trains as long as the small batch's {args.epochs:g} epochs took")  # fmt: skip
    title = (f"digits (x{args.copies} augmented), MLP 64-{args.hidden}-{args.hidden}-10, {args.np} workers,\n"
             f"{budget_text},\nSGD + momentum, lr {args.lr} at batch {args.small_batch} (sqrt rule; goodput: AdaScale)")  # fmt: skip
    heading = f"{title.replace(chr(10), ' ')}; target = small batch's final accuracy - {args.margin * 100:.1f} points"
    parts = [f"Over seeds {', '.join(map(str, args.seeds))}:\n\n{seeds_table(per_seed)}\n"]
    for seed, (target, rows) in per_seed.items():
        parts.append(f"Seed {seed}:\n\n{markdown_table(target, rows)}\n")
    text = "\n".join(parts)
    print(f"\n{heading}\n\n{text}", flush=True)
    first = args.seeds[0]
    plot(all_runs[first], per_seed[first][0], Path(args.plot), f"{title} (seed {first})")
    load = os.getloadavg()
    Path(args.plot).with_suffix(".md").write_text(
        f"{heading}; load average at the end {load[0]:.1f} on {os.cpu_count()} cores (`make bench-adaptive`)\n\n{text}"
    )
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    out = BUILD_DIR / "adaptive_batch.json"
    out.write_text(json.dumps({"meta": machine_metadata(), "args": vars(args),
                               "seeds": {seed: {"target": t, "rows": rows, "runs": all_runs[seed]}
                                         for seed, (t, rows) in per_seed.items()}}, indent=1, default=str))  # fmt: skip
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
    p.add_argument("--margin", type=float, default=0.005, help="target = small batch's final accuracy - margin")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[7, 8, 9],
                   help="comma-separated; every mode runs once per seed")
    p.add_argument("--same-epochs", action="store_true", help="every run trains --epochs (default: the small "
                   "batch's training time is every other run's budget)")
    p.add_argument("--epochs-cap", type=float, default=4.0, help="with a time budget, at most this many times "
                   "--epochs")
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
