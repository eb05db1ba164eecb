"""KungFu's Listing 1 end to end (``make bench-listing-one``): a cluster that grows with the GNS, beside static sizes.

    .venv/bin/python -m benchmarks.listing_one
    .venv/bin/python -m benchmarks.listing_one --epochs 4 --runs static-1,listing-one

Three runs of the same training (benchmarks/listing_one/worker.py: the
digits MLP on scikit-learn's digits enlarged by seeded augmentation,
benchmarks/harness/digits_augmented.py; SGD with momentum; a ``GradientMonitor`` in
every run; the same per-worker batch, so the global batch is the size times
it, and the learning rate ``lr x sqrt(size)``; the same number of epochs):

* ``static-1``: ``kungfu-run -np 1``;
* ``static-4``: ``kungfu-run -np 4`` (``--max-np`` workers);
* ``listing-one``: ``kungfu-run --elastic -np 1 --max-np 4`` with
  ``GNSResizePolicy(max_size=4)`` checked after every epoch (KungFu
  Listing 1): when the gradient noise scale grows by r, the cluster grows to
  ``int(size x r)`` workers.

Reported per run: the training time (rank 0's clock, evaluation excluded),
the time to a target accuracy (static 1's final accuracy minus
``--margin``), the speed-up over static 1 in reaching it, the final and best
held-out accuracy, the sample throughput and, for Listing 1, when each
growth was asked for and when the joiners were admitted. Prints a markdown
table, writes the records as JSON (build/bench/listing_one.json) and a PNG
plot of accuracy, cluster size and GNS against training time
(benchmarks/results/listing_one.png by default; the table next to it, .md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import BUILD_DIR, REPO, RESULTS_DIR
from benchmarks.harness.proc import run_group
from benchmarks.harness.timing import parse_results

EXP_DIR = Path(__file__).resolve().parent
WORKER_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
RUNS = ("static-1", "static-4", "listing-one")
LABELS = {"static-1": "static 1 worker", "static-4": "static 4 workers", "listing-one": "Listing 1 (GNSResizePolicy)"}
COLORS = {"static-1": "tab:blue", "static-4": "tab:orange", "listing-one": "tab:green"}
ASKED = re.compile(r"step (\d+): size (\d+) -> (\d+)")


def log(msg: str) -> None:
    print(f"[bench-listing-one] {msg}", file=sys.stderr, flush=True)


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
    return next((r["time_s"] for r in records if r["accuracy"] >= target), None)


def size_path(run: dict[str, Any]) -> str:
    """The sizes rank 0 trained at, in order: "1", "1 -> 2 -> 4".

    Example:
        >>> size_path({"sizes": [{"size": 1}, {"size": 2}, {"size": 4}]})
        '1 -> 2 -> 4'
    """
    return " -> ".join(str(s["size"]) for s in run["sizes"])


def growths(run: dict[str, Any]) -> list[dict[str, Any]]:
    """Each growth Listing 1 asked for: the step and training time of the request and of the arrival.

    Arrival: the first size at or above the one asked for, at or after the
    request (rank 0's view; a request made while an earlier growth was
    pending may arrive with it). None when the run ended first.

    Example:
        >>> run = {"decisions": [{"step": 10, "time_s": 2.0, "text": "step 10: size 1 -> 2 pending: ... [GNSResizePolicy (...)]"}],
        ...        "sizes": [{"size": 1, "step": 0, "time_s": 0.0}, {"size": 2, "step": 15, "time_s": 3.0}]}
        >>> growths(run)
        [{'to': 2, 'asked_step': 10, 'asked_s': 2.0, 'arrived_step': 15, 'arrived_s': 3.0}]
    """
    out = []
    for d in run["decisions"]:
        m = ASKED.match(d["text"])
        if not m or "GNSResizePolicy" not in d["text"]:
            continue
        new = int(m.group(3))
        arrived = next((s for s in run["sizes"] if s["step"] >= d["step"] and s["size"] >= new), None)
        out.append({"to": new, "asked_step": d["step"], "asked_s": d["time_s"],
                    "arrived_step": None if arrived is None else arrived["step"],
                    "arrived_s": None if arrived is None else arrived["time_s"]})  # fmt: skip
    return out


def summary_rows(runs: dict[str, dict[str, Any]], margin: float) -> tuple[float, list[dict[str, Any]]]:
    """(target accuracy, one row per run): final and best accuracy, training time, time to target, speed-up.

    The target is static 1's final accuracy minus ``margin``.
    """
    target = runs["static-1"]["records"][-1]["accuracy"] - margin
    base_tta = time_to_accuracy(runs["static-1"]["records"], target)
    rows = []
    for name in RUNS:
        if name not in runs:
            continue
        run = runs[name]
        recs = run["records"]
        tta = time_to_accuracy(recs, target)
        train_s = recs[-1]["time_s"]
        rows.append({
            "run": name,
            "sizes": size_path(run),
            "steps": recs[-1]["step"],
            "train_time_s": train_s,
            "samples_per_s": recs[-1]["samples"] / train_s if train_s > 0 else None,
            "time_to_target_s": tta,
            "speedup_vs_static_1": None if tta is None or base_tta is None or tta == 0 else base_tta / tta,
            "final_accuracy": recs[-1]["accuracy"],
            "best_accuracy": max(r["accuracy"] for r in recs),
            "final_gns": recs[-1]["gns"],
            "growths": growths(run),
        })  # fmt: skip
    return target, rows


def growth_text(g: dict[str, Any]) -> str:
    """``-> 2: asked 11.5 s, in 27.0 s``

    Example:
        >>> growth_text({"to": 2, "asked_s": 11.5, "arrived_s": 27.0})
        '-> 2: asked 11.5 s, in 27.0 s'
    """
    arrived = "not before the end" if g["arrived_s"] is None else f"in {g['arrived_s']:.1f} s"
    return f"-> {g['to']}: asked {g['asked_s']:.1f} s, {arrived}"


def markdown_table(target: float, rows: Sequence[dict[str, Any]]) -> str:
    head = ["run", "workers", "steps", "training time", "samples/s", f"time to {target:.1%}", "vs static 1",
            "final acc.", "best acc.", "final GNS", "growths (training time)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tta = "not reached" if r["time_to_target_s"] is None else f"{r['time_to_target_s']:.1f} s"
        speed = "" if r["speedup_vs_static_1"] is None else f"{r['speedup_vs_static_1']:.2f}x"
        rate = "" if r["samples_per_s"] is None else f"{r['samples_per_s']:.0f}"
        grew = "; ".join(growth_text(g) for g in r["growths"])
        lines.append(f"| {LABELS[r['run']]} | {r['sizes']} | {r['steps']} | {r['train_time_s']:.1f} s | {rate} | {tta} | "
                     f"{speed} | {r['final_accuracy']:.1%} | {r['best_accuracy']:.1%} | {r['final_gns']:.0f} | {grew} |")  # fmt: skip
    return "\n".join(lines)


def parse_table(text: str) -> list[dict[str, str]]:
    """The rows of :func:`markdown_table`'s output as {column: cell} (for checks and tests).

    Example:
        >>> parse_table("| a | b |\\n|---|---|\\n| 1 | 2 |")
        [{'a': '1', 'b': '2'}]
    """
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    head, body = cells[0], [c for c in cells[1:] if not all(set(x) <= {"-"} for x in c)]
    return [dict(zip(head, row, strict=True)) for row in body]


def plot(runs: dict[str, dict[str, Any]], target: float, path: Path, title: str) -> None:
    """Accuracy (top), cluster size (middle) and GNS (bottom, log scale) against training time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, size_ax, gns_ax) = plt.subplots(3, 1, sharex=True, figsize=(7.5, 8), height_ratios=[2, 1, 1.3])
    for name in RUNS:
        if name not in runs:
            continue
        run, color, label = runs[name], COLORS[name], LABELS[name]
        recs = run["records"]
        t = [r["time_s"] for r in recs]
        acc_ax.plot(t, [100 * r["accuracy"] for r in recs], color=color, label=label)
        points = [(s["time_s"], s["size"]) for s in run["sizes"]] + [(t[-1], run["sizes"][-1]["size"])]
        size_ax.step([p[0] for p in points], [p[1] for p in points], where="post", color=color, label=label)
        gns = [(r["time_s"], r["gns"]) for r in recs if r["gns"] is not None and r["gns"] == r["gns"] and r["gns"] > 0]
        gns_ax.plot([g[0] for g in gns], [g[1] for g in gns], color=color, label=label, marker=".", markersize=3)
        for g in growths(run):
            for ax in (acc_ax, size_ax, gns_ax):
                ax.axvline(g["asked_s"], color=color, linestyle=":", linewidth=1)
    acc_ax.axhline(100 * target, color="gray", linestyle="--", linewidth=1, label=f"target {target:.1%}")
    acc_ax.set_ylabel("held-out accuracy (%)")
    acc_ax.set_ylim(max(0, 100 * target - 12), 100)
    acc_ax.legend(loc="lower right", fontsize=8)
    acc_ax.set_title(title, fontsize=9)
    size_ax.set_ylabel("workers")
    size_ax.set_yticks(range(1, 1 + max(s["size"] for r in runs.values() for s in r["sizes"])))
    gns_ax.set_yscale("log")
    gns_ax.set_ylabel("GNS (smoothed)")
    gns_ax.set_xlabel("training time (s, rank 0, evaluation excluded); dotted: Listing 1 asks to grow")
    for ax in (acc_ax, size_ax, gns_ax):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- runs
def launcher_args(name: str, max_np: int) -> list[str]:
    """kungfu-run's arguments for a run.

    Example:
        >>> launcher_args("listing-one", 4), launcher_args("static-4", 4)
        (['--elastic', '-np', '1', '--max-np', '4'], ['-np', '4'])
    """
    if name == "listing-one":
        return ["--elastic", "-np", "1", "--max-np", str(max_np)]
    return ["-np", "1" if name == "static-1" else str(max_np)]


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "kungfu_tf.run", *launcher_args(name, args.max_np),
        sys.executable, str(EXP_DIR / "worker.py"),
        "--mode", "listing-one" if name == "listing-one" else "static", "--max-size", str(args.max_np),
        "--batch", str(args.batch), "--epochs", str(args.epochs), "--copies", str(args.copies), "--lr", str(args.lr),
        "--hidden", str(args.hidden), "--every", str(args.every), "--unit", args.unit,
        "--smoothing", str(args.smoothing), "--evals-per-epoch", str(args.evals_per_epoch), "--seed", str(args.seed),
    ]  # fmt: skip
    log(f"{name} ...")
    t0 = time.monotonic()
    echo = (lambda i, line: print(line, file=sys.stderr, flush=True)) if args.verbose else None
    (res,) = run_group([argv], [worker_env()], timeout_s=args.launch_timeout, on_line=echo, cwd=str(REPO))
    found = parse_results(res.lines)
    if not res.ok or not found:
        raise RuntimeError(f"{name} run failed (exit status {res.returncode}):\n{res.tail(40)}")
    run = found[0]
    for d in run["decisions"]:
        log(f"  {d['text']} (training time {d['time_s']:.1f} s)")
    log(f"{name}: sizes {size_path(run)}, done in {time.monotonic() - t0:.0f} s (launch included)")
    return run


def check_consistent(runs: dict[str, dict[str, Any]], max_np: int) -> None:
    """What every run must satisfy, whatever the timings: raises AssertionError naming the run otherwise."""
    for name, run in runs.items():
        recs, sizes = run["records"], [s["size"] for s in run["sizes"]]
        assert all(1 <= s <= max_np for s in sizes), (name, sizes)
        assert sizes == sorted(set(sizes)), (name, "the cluster only grows", sizes)
        if name != "listing-one":
            assert sizes == [1 if name == "static-1" else max_np], (name, sizes)
        assert [r["time_s"] for r in recs] == sorted(r["time_s"] for r in recs), name
        assert [r["samples"] for r in recs] == sorted(r["samples"] for r in recs), name
        assert recs[-1]["samples"] >= run["args"]["epochs"] * run["samples_per_epoch"], (name, recs[-1])
        assert all(r["batch_size"] == r["size"] * run["args"]["batch"] for r in recs), name


def experiment(args: argparse.Namespace) -> int:
    runs = {name: run_one(name, args) for name in args.runs}
    if "static-1" not in runs:
        raise SystemExit("the target accuracy comes from static 1's run: include 'static-1' in --runs")
    check_consistent(runs, args.max_np)
    target, rows = summary_rows(runs, args.margin)
    title = (f"digits (x{args.copies} augmented), MLP 64-{args.hidden}-{args.hidden}-10, {args.epochs:g} epochs, "
             f"{args.batch} per worker,\nSGD + momentum, lr {args.lr} x sqrt(size), GNS smoothing {args.smoothing}; "
             f"Listing 1:\nGNSResizePolicy(max_size={args.max_np}, every={args.every}, unit={args.unit!r}), "
             f"kungfu-run --elastic -np 1 --max-np {args.max_np}")  # fmt: skip
    table = markdown_table(target, rows)
    caption = f"{title.replace(chr(10), ' ')}; target = static 1's final accuracy - {args.margin:.1%}"
    print(f"\n{caption}\n\n{table}\n", flush=True)
    plot(runs, target, Path(args.plot), title)
    load = os.getloadavg()
    Path(args.plot).with_suffix(".md").write_text(
        f"{caption}; load average at the end {load[0]:.1f} on {os.cpu_count()} cores (`make bench-listing-one`)\n\n"
        f"{table}\n"
    )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": machine_metadata(), "args": vars(args), "target": target, "rows": rows,
                               "runs": runs}, indent=1, default=str))  # fmt: skip
    log(f"plot: {args.plot}; records: {out}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=lambda s: s.split(","), default=list(RUNS), help="comma-separated subset of "
                   + ",".join(RUNS))  # fmt: skip
    p.add_argument("--max-np", type=int, default=4, help="static-4's size and Listing 1's largest cluster")
    p.add_argument("--batch", type=int, default=32, help="per-worker batch size")
    p.add_argument("--epochs", type=float, default=8.0)
    p.add_argument("--copies", type=int, default=16, help="augmented copies of each training image")
    p.add_argument("--lr", type=float, default=0.02, help="SGD learning rate at one worker (x sqrt(size))")
    p.add_argument("--hidden", type=int, default=1024, help="width of the MLP's two hidden layers")
    p.add_argument("--every", type=int, default=1, help="Listing 1 checks the GNS every N units")
    p.add_argument("--unit", default="epoch", choices=("step", "epoch"))
    p.add_argument("--smoothing", type=float, default=0.99, help="the GradientMonitor's EMA decay")
    p.add_argument("--evals-per-epoch", type=int, default=4)
    p.add_argument("--margin", type=float, default=0.01, help="target = static 1's final accuracy - margin")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--plot", default=str(RESULTS_DIR / "listing_one.png"))
    p.add_argument("--json", default=str(BUILD_DIR / "listing_one.json"))
    p.add_argument("--launch-timeout", type=float, default=400.0)
    p.add_argument("--verbose", action="store_true", help="echo the workers' output")
    args = p.parse_args(argv)
    unknown = [r for r in args.runs if r not in RUNS]
    if unknown:
        p.error(f"--runs: unknown {', '.join(unknown)} (choose from {', '.join(RUNS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    return experiment(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
