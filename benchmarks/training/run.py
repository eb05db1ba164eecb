"""Training-throughput benchmark: kungfu_tf S-SGD vs TensorFlow MWMS.

For every selected model of models/registry.py and every np, on loopback:
  * ours: a tf.function training step with SynchronousSGDOptimizer, launched
    with ``python -m kungfu_tf.run -np N`` (benchmarks/training/worker_kungfu.py);
  * MWMS: the same model, per-worker batch, optimizer and thread settings
    in a custom ``strategy.run`` loop under MultiWorkerMirroredStrategy
    (benchmarks/training/worker_mwms.py), N processes with TF_CONFIG on free ports;
  * the no-communication ceiling (np ≥ 2): N independent one-worker runs of
    our worker at the same time, samples/s summed. No data-parallel job of N
    workers sharing this machine can beat it: it is what the cores (and
    their shared memory bandwidth) compute when nothing is exchanged.
Each run measures, after warm-up steps, the time of a fixed number of steps
on rank 0; samples/s is the total over all workers (steps/s x batch x np).
Prints a markdown table and the targets check, and writes JSON.

    .venv/bin/python -m benchmarks.training                  # default subset
    .venv/bin/python -m benchmarks.training --models all --np 2
    .venv/bin/python -m benchmarks.training --models comm-heavy-mlp --steps 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.cli import comma_choices
from benchmarks.harness.load import CpuMeter
from benchmarks.harness.meta import machine_metadata
from benchmarks.harness.paths import BUILD_DIR, REPO
from benchmarks.harness.proc import LOOPBACK, free_ports, log, run_group, worker_env
from benchmarks.harness.timing import parse_results

EXP_DIR = Path(__file__).resolve().parent

ALL_MODELS = (
    "teacher-mlp",
    "digits-mlp",
    "resnet20",
    "resnet56",
    "bert-small",
    "ncf",
    "comm-heavy-mlp",
)
DEFAULT_MODELS = "comm-heavy-mlp,digits-mlp,resnet20,bert-small"
IMPLS = ("kungfu", "mwms", "ceiling")

# Timed steps per model unless --steps is given: tiny models need many steps
# for a measurable interval, big ones few to keep the run short.
DEFAULT_STEPS = {
    "teacher-mlp": 200,
    "digits-mlp": 200,
    "resnet20": 20,
    "resnet56": 5,
    "bert-small": 10,
}
FALLBACK_STEPS = 10

COMM_HEAVY = "comm-heavy-mlp"
COMM_HEAVY_NP, COMM_HEAVY_FACTOR = 2, 3.0
FOREIGN_WARN_CORES = 0.2  # cores used by other processes worth a warning


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--models",
        default=DEFAULT_MODELS,
        help=f"comma-separated, or 'all' (default {DEFAULT_MODELS})",
    )
    p.add_argument(
        "--np", default="1,2,4", help="comma-separated worker counts (default 1,2,4)"
    )
    p.add_argument(
        "--only", default=",".join(IMPLS), help="subset of kungfu,mwms,ceiling (default all)"
    )
    p.add_argument(
        "--batch-size", type=int, default=32, help="per-worker batch size (default 32)"
    )
    p.add_argument(
        "--warmup", type=int, default=3, help="untimed steps first (default 3)"
    )
    p.add_argument(
        "--steps",
        type=int,
        help=f"timed steps (default per model: {DEFAULT_STEPS}, else {FALLBACK_STEPS})",
    )
    p.add_argument(
        "--lr", type=float, default=0.01, help="SGD learning rate, momentum 0.9"
    )
    p.add_argument(
        "--inter-op",
        type=int,
        default=2,
        help="TF inter-op threads per worker (intra-op is 1)",
    )
    p.add_argument(
        "--launch-timeout",
        type=float,
        default=600.0,
        help="kill a run after this many seconds",
    )
    p.add_argument(
        "--json",
        type=Path,
        default=BUILD_DIR / "training.json",
        help="raw results file",
    )
    args = p.parse_args(argv)

    args.models = comma_choices(p, "--models", args.models, ALL_MODELS)
    try:
        args.np = [int(v) for v in args.np.split(",")]
    except ValueError as e:
        p.error(str(e))
    if any(n < 1 for n in args.np):
        p.error("--np: worker counts must be at least 1")
    args.only = comma_choices(p, "--only", args.only, IMPLS, allow_all=False)
    if args.steps is not None and args.steps < 1:
        p.error("--steps must be at least 1")
    return args


def worker_args(model: str, args: argparse.Namespace) -> list[str]:
    """Options shared by both worker kinds, so both run the same job."""
    steps = args.steps or DEFAULT_STEPS.get(model, FALLBACK_STEPS)
    return [
        "--model", model,
        "--batch-size", str(args.batch_size),
        "--warmup", str(args.warmup),
        "--steps", str(steps),
        "--lr", str(args.lr),
        "--intra-op", "1",
        "--inter-op", str(args.inter_op),
    ]  # fmt: skip


def first_result(lines: list[str], impl: str) -> dict[str, Any] | None:
    """The worker's result record, if it printed one."""
    found = [r for r in parse_results(lines) if r.get("impl") == impl]
    return found[0] if found else None


def run_kungfu(
    model: str, n: int, args: argparse.Namespace, errors: list[str]
) -> dict[str, Any] | None:
    """One ``kungfu_tf.run`` launch of n workers."""
    argv = [
        sys.executable, "-m", "kungfu_tf.run", "-np", str(n),
        sys.executable, str(EXP_DIR / "worker_kungfu.py"), *worker_args(model, args),
    ]  # fmt: skip
    (res,) = run_group(
        [argv], [worker_env()], timeout_s=args.launch_timeout, cwd=str(REPO)
    )
    rec = first_result(res.lines, "kungfu")
    if not res.ok or rec is None:
        errors.append(
            f"kungfu {model} np={n}: exit status {res.returncode}:\n{res.tail()}"
        )
    return rec


def run_mwms(
    model: str, n: int, args: argparse.Namespace, errors: list[str]
) -> dict[str, Any] | None:
    """n plain TF processes forming a MultiWorkerMirroredStrategy cluster."""
    workers = [f"{LOOPBACK}:{port}" for port in free_ports(n)]
    envs = [
        worker_env(
            {
                "TF_CONFIG": json.dumps(
                    {
                        "cluster": {"worker": workers},
                        "task": {"type": "worker", "index": i},
                    }
                )
            }
        )
        for i in range(n)
    ]
    argv = [
        sys.executable,
        str(EXP_DIR / "worker_mwms.py"),
        *worker_args(model, args),
    ]
    results = run_group([argv] * n, envs, timeout_s=args.launch_timeout, cwd=str(REPO))
    rec = first_result(results[0].lines, "mwms")
    for i, res in enumerate(results):
        if not res.ok or (i == 0 and rec is None):
            errors.append(
                f"mwms {model} np={n} worker {i}: exit status {res.returncode}:\n{res.tail()}"
            )
    return rec


def run_ceiling(
    model: str, n: int, args: argparse.Namespace, errors: list[str]
) -> dict[str, Any] | None:
    """n independent one-worker runs at once: the throughput with no communication."""
    argv = [
        sys.executable, str(EXP_DIR / "worker_kungfu.py"), *worker_args(model, args),
    ]  # fmt: skip
    results = run_group([argv] * n, [worker_env()] * n, timeout_s=args.launch_timeout, cwd=str(REPO))
    recs = [first_result(res.lines, "kungfu") for res in results]
    for i, (res, rec) in enumerate(zip(results, recs)):
        if not res.ok or rec is None:
            errors.append(f"ceiling {model} np={n} run {i}: exit status {res.returncode}:\n{res.tail()}")
    if any(rec is None for rec in recs):
        return None
    return {
        **recs[0],
        "impl": "ceiling",
        "np": n,
        "samples_per_s": sum(rec["samples_per_s"] for rec in recs),
        "final_loss": max(rec["final_loss"] for rec in recs),
        "loss_finite": all(rec["loss_finite"] for rec in recs),
    }


def timed_phase(
    name: str, fn: Callable[[], dict[str, Any] | None]
) -> dict[str, Any] | None:
    """Runs one launch; records the wall time and other processes' CPU use."""
    log(f"{name} ...")
    meter, t0 = CpuMeter(), time.monotonic()
    rec = fn()
    wall = time.monotonic() - t0
    foreign = meter.foreign(wall)
    if rec is not None:
        rec["launch_wall_s"] = wall
        rec["foreign_cpu_cores"] = foreign
        log(
            f"{name}: {rec['samples_per_s']:.0f} samples/s, final loss {rec['final_loss']:.4g} ({wall:.0f} s)"
        )
    else:
        log(f"{name}: FAILED ({wall:.0f} s)")
    if foreign is not None and foreign > FOREIGN_WARN_CORES:
        log(f"warning: other processes used {foreign:.2f} cores during {name}")
    return rec


def rows(
    points: list[dict[str, Any]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """One row per (model, np): both implementations' throughput and ratio."""
    by_key = {(p["impl"], p["model"], p["np"]): p for p in points}
    out = []
    for model in args.models:
        for n in args.np:
            ours, mwms, ceiling = (by_key.get((impl, model, n)) for impl in IMPLS)
            row: dict[str, Any] = {
                "model": model,
                "np": n,
                "ours": ours["samples_per_s"] if ours else None,
                "mwms": mwms["samples_per_s"] if mwms else None,
                "ceiling": ceiling["samples_per_s"] if ceiling else None,
                "ratio": None,
                "of_ceiling": None,
            }
            if row["ours"] and row["mwms"]:
                row["ratio"] = row["ours"] / row["mwms"]
            if row["ours"] and row["ceiling"]:
                row["of_ceiling"] = row["ours"] / row["ceiling"]
            row["loss_ok"] = all(p is None or p["loss_finite"] for p in (ours, mwms, ceiling))
            out.append(row)
    return out


def targets(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The two throughput targets, evaluated on the measured rows.

    "≥ MWMS on every model" uses the distributed rows (np ≥ 2): at np=1
    there is no communication to compare, only per-step overheads.
    """
    dist = [r for r in table if r["np"] >= 2]
    missing = [r for r in dist if r["ratio"] is None]
    worst = min(
        (r for r in dist if r["ratio"] is not None),
        key=lambda r: r["ratio"],
        default=None,
    )
    met = bool(dist) and not missing and worst is not None and worst["ratio"] >= 1.0
    detail = (
        "no distributed rows measured"
        if worst is None
        else f"lowest ratio {worst['ratio']:.2f} ({worst['model']} np={worst['np']})"
    )
    if missing:
        detail += f"; {len(missing)} row(s) missing"
    out = [{"target": "≥ MWMS on every model (np ≥ 2)", "met": met, "detail": detail}]

    heavy = [r for r in table if r["model"] == COMM_HEAVY and r["np"] == COMM_HEAVY_NP]
    ratio = heavy[0]["ratio"] if heavy else None
    detail = "not measured" if ratio is None else f"ratio {ratio:.2f}"
    if ratio is not None and heavy[0]["ceiling"]:
        needed, ceiling = COMM_HEAVY_FACTOR * heavy[0]["mwms"], heavy[0]["ceiling"]
        detail += (
            f"; {COMM_HEAVY_FACTOR:g}× MWMS = {needed:,.0f} samples/s against a no-communication "
            f"ceiling of {ceiling:,.0f} ({'reachable' if needed <= ceiling else 'not reachable on this machine'})"
            f"; ours = {heavy[0]['of_ceiling']:.0%} of the ceiling"
        )
    out.append(
        {
            "target": f"comm-heavy MLP at np={COMM_HEAVY_NP} ≥ {COMM_HEAVY_FACTOR:g}× MWMS",
            "met": ratio is not None and ratio >= COMM_HEAVY_FACTOR,
            "detail": detail,
        }
    )
    return out


def fmt(v: float | None) -> str:
    """Samples/s cell."""
    return "—" if v is None else f"{v:,.0f}"


def print_report(
    table: list[dict[str, Any]], evals: list[dict[str, Any]], meta: dict[str, Any]
) -> None:
    """The markdown report on stdout."""
    print(
        f"### Training throughput (samples/s, all workers; batch {meta['batch_size']} per worker)\n"
    )
    print("| model | np | ours | MWMS | ours/MWMS | no-comm ceiling | ours/ceiling | final loss finite |")
    print("|---|---:|---:|---:|---:|---:|---:|:---:|")
    for r in table:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        of_ceiling = "—" if r["of_ceiling"] is None else f"{r['of_ceiling']:.0%}"
        print(
            f"| {r['model']} | {r['np']} | {fmt(r['ours'])} | {fmt(r['mwms'])} | {ratio} | {fmt(r['ceiling'])} "
            f"| {of_ceiling} | {'yes' if r['loss_ok'] else 'NO'} |"
        )
    print("\n### Targets\n")
    print("| target | status | detail |")
    print("|---|---|---|")
    for e in evals:
        print(f"| {e['target']} | {'MET' if e['met'] else 'NOT MET'} | {e['detail']} |")
    foreign = [v for v in meta["foreign_cpu_cores"].values() if v is not None]
    noise = f"; other processes used ≤ {max(foreign):.2f} cores" if foreign else ""
    print(
        f"\n_{meta['date']}, {meta['cpu_count']} cores, TF {meta['tensorflow']}, intra-op 1 / inter-op "
        f"{meta['inter_op']} threads per worker, warm-up {meta['warmup']} steps; "
        f"load {meta['loadavg_start'][0]:.2f} → {meta['loadavg_end'][0]:.2f}{noise}; raw results in {meta['json']}_"
    )


def metadata(args: argparse.Namespace) -> dict[str, Any]:
    """Where and how the numbers were taken."""
    return {
        **machine_metadata(),
        "models": args.models,
        "np": args.np,
        "batch_size": args.batch_size,
        "warmup": args.warmup,
        "steps": args.steps,
        "lr": args.lr,
        "inter_op": args.inter_op,
        "json": str(args.json),
    }


def main(argv: list[str] | None = None) -> int:
    """Runs every (model, np, implementation), prints the report, writes JSON."""
    args = parse_args(argv)
    meta = metadata(args)
    if meta["loadavg_start"][0] > 0.5:
        log(
            f"warning: 1-min load average is {meta['loadavg_start'][0]:.2f}; numbers will be noisy"
        )
    runners = {"kungfu": run_kungfu, "mwms": run_mwms, "ceiling": run_ceiling}
    errors: list[str] = []
    points: list[dict[str, Any]] = []
    foreign: dict[str, float | None] = {}
    for model in args.models:
        for n in args.np:
            for impl in args.only:
                if impl == "ceiling" and n < 2:
                    continue  # one process is the kungfu row itself
                name = f"{impl} {model} np={n}"
                rec = timed_phase(
                    name,
                    lambda impl=impl, model=model, n=n: runners[impl](
                        model, n, args, errors
                    ),
                )
                if rec is not None:
                    foreign[name] = rec["foreign_cpu_cores"]
                    points.append(rec)
                    if not math.isfinite(rec["final_loss"]):
                        errors.append(
                            f"{name}: final loss {rec['final_loss']} is not finite"
                        )
    table = rows(points, args)
    evals = targets(table)
    meta["loadavg_end"] = os.getloadavg()
    meta["foreign_cpu_cores"] = foreign
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "meta": meta,
        "points": points,
        "table": table,
        "targets": evals,
        "errors": errors,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print_report(table, evals, meta)
    for e in errors:
        log("ERROR " + e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
