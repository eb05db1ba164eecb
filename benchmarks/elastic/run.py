"""Idle time of elastic transitions against checkpoint-restart (``make bench-elastic``).

Or et al.'s Table 1 metric (§7.2) and KungFu §6.3, on this machine: for each
transition of ``--transitions`` (default: shrink 4 -> 2, grow 2 -> 4,
shrink 4 -> 1, grow 1 -> 4, crash 4 -> 3, replace 3 -> 4), repeated
``--repeats`` times, the time the surviving workers train nothing
(benchmarks/elastic/idle.py defines it precisely), measured twice in one run:

* **elastic**: one ``kungfu-run --elastic`` job runs the whole schedule
  (benchmarks/elastic/worker.py ``--mode elastic``): shrinks through ``resize``,
  grows by requesting the size early and letting the joiners warm up while
  the survivors train (they are admitted when ready), a crash by a worker
  SIGKILLing itself between steps (the others are then inside the next step),
  after which the launcher (``--max-np``) starts a replacement that joins
  like a grower ("replace");
* **checkpoint-restart**: the same schedule as a chain of plain ``kungfu-run``
  jobs (``--mode restart``): each trains ``--steps`` steps, rank 0 saves a
  ``tf.train.Checkpoint`` (model, optimizer slots, step), every process
  exits (for a crash: the victim SIGKILLs itself after the save and the
  launcher stops the job), and the next job starts at the new size and
  restores.

On the digits MLP (64-256-256-10, 83 k parameters), a wide one
(64-2048-2048-2048-10, 8.5 M parameters: 68 MB of weights and momentum to
save or transfer) and one of ResNet-50's size (64-3584-3584-3584-10, 26 M
parameters: 208 MB), global batch ``--global-batch`` split over the workers.
Prints one table per model (median idle, raw values, ratio, target) and a
break-down of the restarts; writes them to ``--out`` (.md) and the raw
transitions to the same name .json (``--report FILE.json`` re-renders one).

    .venv/bin/python -m benchmarks.elastic                       # ~15-30 min on 2 cores
    .venv/bin/python -m benchmarks.elastic --models digits-mlp --repeats 1 --modes restart
    # the config service's admission window against admitting each joiner when ready:
    .venv/bin/python -m benchmarks.elastic --models digits-mlp --modes elastic --admit-windows 5,0 \
        --transitions "grow 1 -> 4,shrink 4 -> 2,grow 2 -> 4,shrink 4 -> 1"

With ``--admit-windows W1,W2,...`` the elastic job runs once per
``kungfu-run --admit-window`` value, each reported as its own table
("digits-mlp, --admit-window 5"); checkpoint-restart runs once per model.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.elastic.idle import Transition, parse_label, read_logs, transitions
from benchmarks.elastic.worker import MODELS
from benchmarks.harness.meta import machine_metadata

EXP_DIR = Path(__file__).resolve().parent
BENCH_DIR = EXP_DIR.parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
WORK_DIR = REPO / "build" / "bench" / "elastic"
DEFAULT_TRANSITIONS = ("shrink 4 -> 2", "grow 2 -> 4", "shrink 4 -> 1", "grow 1 -> 4", "crash 4 -> 3", "replace 3 -> 4")
MODES = ("elastic", "restart")
KINDS = ("shrink", "grow", "crash", "replace")
# Issue 23's targets: every transition >= RATIO_TARGET x faster than
# checkpoint-restart in the same run, and besides a shrink within
# SHRINK_IDLE_TARGET_S, a crash within its detection + CRASH_MARGIN_S.
SHRINK_IDLE_TARGET_S, RATIO_TARGET, CRASH_MARGIN_S = 0.3, 50.0, 1.0


def log(msg: str) -> None:
    print(f"[bench-elastic] {msg}", file=sys.stderr, flush=True)


def worker_env(extra: Sequence[str] = ()) -> dict[str, str]:
    """This environment without stray KUNGFU_* variables, benchmarks/ and this checkout first on the path,
    then ``extra`` (``KEY=VALUE`` items of ``--worker-env``: e.g. ``KUNGFU_AUTO_PROBES=0``).

    Example:
        >>> worker_env(["KUNGFU_AUTO_PROBES=0"])["KUNGFU_AUTO_PROBES"]
        '0'
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + ([path] if path else []))
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.update(parse_env_item(item) for item in extra)
    return env


def parse_env_item(item: str) -> tuple[str, str]:
    """``"K=V"`` -> ("K", "V"); ValueError naming the item otherwise.

    Example:
        >>> parse_env_item("KUNGFU_AUTO_LOG=1")
        ('KUNGFU_AUTO_LOG', '1')
    """
    key, sep, value = item.partition("=")
    if not sep or not key or not key.replace("_", "").isalnum() or key[0].isdigit():
        raise ValueError(f"--worker-env item {item!r} is not KEY=VALUE with KEY a variable name")
    return key, value


def check_schedule(labels: Sequence[str]) -> list[tuple[str, int, int]]:
    """Parsed labels; ValueError unless each starts at the size the previous one ended with.

    Example:
        >>> check_schedule(["shrink 4 -> 2", "grow 2 -> 4"])
        [('shrink', 4, 2), ('grow', 2, 4)]
    """
    parsed = [parse_label(lab) for lab in labels]
    for (kind, before, after), lab in zip(parsed, labels, strict=True):
        if kind not in KINDS:
            raise ValueError(f"transition {lab!r}: kind must be one of {', '.join(KINDS)}")
        ok = {"shrink": after < before, "grow": after > before, "crash": after == before - 1, "replace": after > before}
        if not ok[kind] or after < 1:
            raise ValueError(f"transition {lab!r}: sizes do not fit a {kind}")
    for (_, _, after), (_, before, _), lab in zip(parsed, parsed[1:], labels[1:], strict=False):
        if before != after:
            raise ValueError(f"transition {lab!r} starts at {before} workers, the one before it ends at {after}")
    return parsed


# --------------------------------------------------------------------------- running jobs
def launch(argv: Sequence[str], output: Path, timeout_s: float, env: dict[str, str]) -> tuple[int | None, float, float]:
    """Runs ``argv`` in its own session, output to ``output``: (exit status or None if killed, start, end).

    Waits on the process itself (no polling), so the next job of a restart
    chain starts as soon as this one has exited.
    """
    with open(output, "ab") as out:
        t0 = time.time()
        proc = subprocess.Popen(list(argv), cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            rc: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log(f"timeout after {timeout_s:.0f} s: {' '.join(argv[:8])} ...; see {output}")
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(5)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
            rc = None
        return rc, t0, time.time()


def worker_argv(args: argparse.Namespace, model: str, log_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, str(EXP_DIR / "worker.py"), "--model", model, "--steps", str(args.steps),
            "--global-batch", str(args.global_batch), "--log-dir", str(log_dir), *extra]  # fmt: skip


def run_restart_chain(args: argparse.Namespace, model: str, labels: Sequence[str], work: Path) -> dict[str, Any]:
    """The schedule as a chain of plain kungfu-run jobs; returns the logs' records and the launcher times."""
    parsed = check_schedule(labels)
    log_dir, ckpt = work / "logs", work / "ckpt" / "state"
    sizes = [parsed[0][1]] + [after for _, _, after in parsed]
    jobs = []
    for j, size in enumerate(sizes):
        crash = j < len(parsed) and parsed[j][0] == "crash"
        extra = ["--mode", "restart", "--job-index", str(j)]
        extra += ["--restore", str(ckpt)] if j > 0 else []
        extra += ["--save", str(ckpt)] if j < len(parsed) else []
        extra += ["--crash-rank", str(args.crash_rank)] if crash else []
        argv = [sys.executable, "-m", "kungfu_tf.run", "-np", str(size), "-q", "--logdir", str(work / f"job{j}"),
                *worker_argv(args, model, log_dir, *extra)]  # fmt: skip
        rc, t0, t1 = launch(argv, work / f"job{j}.out", args.job_timeout, worker_env(args.worker_env))
        jobs.append({"job": j, "size": size, "rc": rc, "spawn_t": t0, "exit_t": t1, "crash": crash})
        log(f"{model} restart job {j}: {size} workers, exit status {rc}, {t1 - t0:.1f} s")
        (work / "jobs.json").write_text(json.dumps(jobs))  # for --from-logs
        if rc != 0 and not (crash and rc is not None):
            raise RuntimeError(f"restart job {j} ({size} workers) failed with exit status {rc}: see {work}")
    return {"records": read_logs(log_dir), "jobs": jobs}


def elastic_schedule(labels: Sequence[str]) -> str:
    """The worker's ``--schedule``: ``shrink 4 -> 2`` -> ``shrink:2`` etc.

    Example:
        >>> elastic_schedule(["shrink 4 -> 2", "crash 2 -> 1"])
        'shrink:2,crash:1'
    """
    return ",".join(f"{kind}:{after}" for kind, _, after in check_schedule(labels))


def run_elastic_job(args: argparse.Namespace, model: str, labels: Sequence[str], work: Path,
                    admit_window: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The schedule in one ``kungfu-run --elastic`` job (``--admit-window`` if given); returns the logs'
    records and its exit status."""
    parsed = check_schedule(labels)
    log_dir = work / "logs"
    np_max = max(max(b, a) for _, b, a in parsed)
    window = [] if admit_window is None else ["--admit-window", f"{admit_window:g}"]
    argv = [sys.executable, "-m", "kungfu_tf.run", "--elastic", "--min-np", "1", "--max-np", str(np_max),
            *window, "-np", str(parsed[0][1]), "-q", "--logdir", str(work / "workers"),
            *worker_argv(args, model, log_dir, "--mode", "elastic", "--schedule", elastic_schedule(labels),
                         "--crash-rank", str(args.crash_rank))]  # fmt: skip
    rc, t0, t1 = launch(argv, work / "job.out", args.elastic_timeout, worker_env(args.worker_env))
    log(f"{model} elastic job: exit status {rc}, {t1 - t0:.1f} s")
    return {"records": read_logs(log_dir), "rc": rc, "spawn_t": t0, "exit_t": t1}


# --------------------------------------------------------------------------- analysis
def measured_transitions(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> tuple[list[Transition], str | None]:
    """The transitions the logs show (the first ones of ``labels`` if the run stopped early) and why not all."""
    try:
        found, mismatch = transitions(records, labels, partial=True), None
    except ValueError as e:  # sizes off the schedule from some point on: keep what came before it
        mismatch = str(e)
        found = next(f for k in range(len(labels) - 1, -1, -1) if (f := _fitting(records, labels[:k])) is not None)
    done = len(found) + sum(t.merged for t in found)  # a merged crash stands for its replace label too
    why = None if done == len(labels) else f"the logs show {done} of the {len(labels)} transitions"
    if mismatch:
        why = f"{why}; then {mismatch}"
    return found, why


def _fitting(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[Transition] | None:
    try:
        return transitions(records, labels, partial=True)
    except ValueError:
        return None


def restart_breakdown(run: dict[str, Any], trans: Sequence[Transition]) -> list[dict[str, float]]:
    """Where each restart's idle time goes: save, stop, start (imports, model, restore), first step."""
    out = []
    by_job: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for r in run["records"]:
        by_job.setdefault(int(r["job"]), {}).setdefault(r["e"], []).append(r)
    for j, tr in enumerate(trans):
        if j + 1 >= len(run["jobs"]) or "ready" not in by_job.get(j + 1, {}):
            break  # a chain cut short (--from-logs of an interrupted run)
        old, new, job_old, job_new = by_job.get(j, {}), by_job.get(j + 1, {}), run["jobs"][j], run["jobs"][j + 1]
        saved = max((r["t"] for r in old.get("save", [])), default=tr.t_before)
        ready = max(r["t"] for r in new["ready"])
        restore = max((r["t"] - r["t0"] for r in new.get("restore", [])), default=0.0)
        out.append({
            "save_s": saved - tr.t_before,
            "stop_s": job_old["exit_t"] - saved,  # the last worker gone (a crash: detected and torn down)
            "start_s": ready - job_new["spawn_t"],  # launcher, Python, TF, model, restore
            "restore_s": restore,
            "first_step_s": tr.t_after - ready,  # trace + the step
        })  # fmt: skip
    return out


def summarize(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (model, transition label): medians, raw idles, ratio, target verdict."""
    rows = []
    for model, res in results["models"].items():
        for label in dict.fromkeys(results["transitions"]):
            row: dict[str, Any] = {"model": model, "transition": label}
            for mode in MODES:
                trs = [t for t in res.get(mode, {}).get("transitions", []) if t["label"] == label]
                row[f"{mode}_idle"] = [t["idle_s"] for t in trs]
                row[f"{mode}_gap"] = [t["gap_s"] for t in trs]
                row[f"{mode}_step"] = [t["step_s"] for t in trs]
                row[f"{mode}_parts"] = [[p["idle_s"] for p in t.get("parts", [])] for t in trs]
                row[f"{mode}_merged"] = [bool(t.get("merged")) for t in trs]
                row[f"{mode}_median"] = statistics.median(row[f"{mode}_idle"]) if trs else None
                if mode == "elastic":
                    row["split"] = [(t.get("pause_s"), t.get("first_step_s")) for t in trs]
                    row["probe"] = [(t.get("probing_before", False), t.get("first_step_probed", False),
                                     t.get("probe_steps_after", 0), t.get("probe_extra_s", 0.0)) for t in trs]  # fmt: skip
                    det = [t["detection_s"] for t in trs if t["detection_s"] is not None]
                    row["detection_median"] = statistics.median(det) if det else None
                    row["detection"] = det
            e, r = row["elastic_median"], row["restart_median"]
            row["ratio"] = r / e if e and r and e > 0 else None
            row["target"], row["met"] = verdict(label, e, row["ratio"], row["detection_median"])
            rows.append(row)
    return rows


def verdict(label: str, idle: float | None, ratio: float | None, detection: float | None) -> tuple[str, bool | None]:
    """(the issue's target for this transition, met?); met is None when not measured or no target.

    Example:
        >>> verdict("shrink 4 -> 2", 0.1, 120.0, None)
        ('<= 0.3 s and >= 50x', True)
        >>> verdict("grow 2 -> 4", 0.2, 40.0, None)
        ('>= 50x', False)
    """
    kind = parse_label(label)[0]
    if kind == "shrink":
        target = f"<= {SHRINK_IDLE_TARGET_S:g} s and >= {RATIO_TARGET:g}x"
        ok = None if idle is None or ratio is None else ratio >= RATIO_TARGET and idle <= SHRINK_IDLE_TARGET_S
    elif kind == "crash":
        target = f"<= detection + {CRASH_MARGIN_S:g} s and >= {RATIO_TARGET:g}x"
        ok = (None if idle is None or ratio is None or detection is None
              else ratio >= RATIO_TARGET and idle <= detection + CRASH_MARGIN_S)  # fmt: skip
    else:
        target = f">= {RATIO_TARGET:g}x"
        ok = None if idle is None or ratio is None else ratio >= RATIO_TARGET
    return target, ok


def _s(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f} s"


def _raw(xs: Sequence[float], parts: Sequence[Sequence[float]] = (), merged: Sequence[bool] = ()) -> str:
    """``0.120, 0.950 (0.600+0.350), 7.6*``: each run, with its parts when a grow was admitted in several
    versions, ``*`` for a crash measured together with its replacement."""
    if not xs:
        return "–"
    parts = list(parts) or [[]] * len(xs)
    merged = list(merged) or [False] * len(xs)
    return ", ".join(f"{x:.3f}" + (f" ({'+'.join(f'{p:.3f}' for p in ps)})" if len(ps) > 1 else "") + ("*" if m else "")
                     for x, ps, m in zip(xs, parts, merged, strict=True))  # fmt: skip


def _split(runs: Sequence[Sequence[float | None]]) -> str:
    """Each elastic run's gap as (pause between the steps) + (the first step after): ``0.045+0.114``.

    Example:
        >>> _split([(0.045, 0.114), (None, None)])
        '0.045+0.114, –'
    """
    if not runs:
        return "–"
    return ", ".join("–" if pause is None or first is None else f"{pause:.3f}+{first:.3f}" for pause, first in runs)


def _probing(runs: Sequence[Sequence[Any]]) -> str:
    """Each elastic run's AUTO probe around the transition: ``no / no / 0``, ``yes / yes / 12 (+0.310 s)``.

    Example:
        >>> _probing([(False, False, 0, 0.0), (True, True, 12, 0.31)])
        'no / no / 0, yes / yes / 12 (+0.310 s)'
    """
    if not runs:
        return "–"
    yn = {True: "yes", False: "no"}
    return ", ".join(f"{yn[bool(b)]} / {yn[bool(f)]} / {n}" + (f" (+{x:.3f} s)" if n else "") for b, f, n, x in runs)


def markdown(results: dict[str, Any]) -> str:
    """The side-by-side tables (one per model) and the restart break-down."""
    rows = summarize(results)
    parts = []
    for model in results["models"]:
        res = results["models"][model]
        head = ["transition", "elastic idle (median)", "elastic idle, each run", "checkpoint-restart idle (median)",
                "checkpoint-restart, each run", "restart ÷ elastic", "crash detection", "normal step after",
                "target", "met", "elastic: pause + first step, each run",
                "AUTO probing: before / first step / later steps (+ their extra time)"]  # fmt: skip
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in (r for r in rows if r["model"] == model):
            step = r["elastic_step"] or r["restart_step"]
            met = {True: "yes", False: "**no**", None: "–"}[r["met"]]
            ratio = "–" if r["ratio"] is None else f"{r['ratio']:.0f}x"
            lines.append(f"| {r['transition']} | {_s(r['elastic_median'])} | {_raw(r['elastic_idle'], r['elastic_parts'], r['elastic_merged'])} | "
                         f"{_s(r['restart_median'], 2)} | {_raw(r['restart_idle'])} | "
                         f"{ratio} | "
                         f"{_s(r['detection_median'])} | {_s(statistics.median(step)) if step else '–'} | "
                         f"{r['target']} | {met} | {_split(r.get('split', []))} | {_probing(r.get('probe', []))} |")  # fmt: skip
        notes = [f"{mode}: {res[mode]['error']}" for mode in MODES if res.get(mode, {}).get("error")]
        if any(any(r["elastic_merged"]) for r in rows if r["model"] == model):
            lines.append("\n\\* crash and replacement in one transition: the replacement was admitted before the "
                         "survivors' first step without the victim (its replace row has no value for that run)")
        parts.append(f"**{model}** ({results['model_info'][model]})\n\n" + "\n".join(lines)
                     + ("\n\nNot measured: " + "; ".join(notes) if notes else ""))  # fmt: skip
        bd = res.get("restart", {}).get("breakdown")
        if bd:
            keys = ("save_s", "stop_s", "start_s", "restore_s", "first_step_s")
            med = {k: statistics.median(b[k] for b in bd) for k in keys}
            parts.append(f"{model}, checkpoint-restart break-down (median over {len(bd)} restarts): save "
                         f"{med['save_s']:.2f} s, stop {med['stop_s']:.2f} s, start (launcher, Python, TF, model, "
                         f"restore {med['restore_s']:.2f} s) {med['start_s']:.2f} s, first step (trace) "
                         f"{med['first_step_s']:.2f} s")  # fmt: skip
    return "\n\n".join(parts)


def header(results: dict[str, Any]) -> str:
    meta, a = results["meta"], results["args"]
    return (f"Idle time per transition (benchmarks/elastic/idle.py: on the survivors, end of the first step after - end of "
            f"the last step before - the normal step time after; checkpoint-restart: the old job's last step to "
            f"the new job's first), {a['repeats']} repetition(s), {a['steps']} steps between transitions, global "
            f"batch {a['global_batch']}, {meta['cpu_count']} cores, "
            + (f"analysed again from the runs' logs ({meta['date']}, `--from-logs`)" if a.get("from_logs") else
               f"load average {meta['loadavg_start'][0]:.1f} at the start and {results['loadavg_end'][0]:.1f} at the "
               f"end ({meta['date']}, `make bench-elastic`)")
            + (f". {a['note']}" if a.get("note") else ""))  # fmt: skip


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS), help=",".join(MODELS))
    p.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES), help=",".join(MODES))
    p.add_argument("--transitions", type=lambda s: [t.strip() for t in s.split(",")], default=list(DEFAULT_TRANSITIONS),
                   help="comma-separated '<kind> <before> -> <after>', kinds " + ", ".join(KINDS))  # fmt: skip
    p.add_argument("--repeats", type=int, default=3, help="times the schedule runs (in one elastic job)")
    # 30: long enough for AUTO to settle on every layout between two transitions (a one-host class needs
    # ~16 sampled calls), as it has in a job that trains for more than a minute between them; with 8 the
    # transitions met layouts still being probed (the table's last column shows it).
    p.add_argument("--steps", type=int, default=30, help="steps between two transitions")
    p.add_argument("--global-batch", type=int, default=128)
    p.add_argument("--crash-rank", type=int, default=1, help="rank that SIGKILLs itself in a crash")
    p.add_argument("--job-timeout", type=float, default=300.0, help="per restart job (s)")
    p.add_argument("--elastic-timeout", type=float, default=1500.0, help="for the whole elastic job (s)")
    p.add_argument("--work-dir", default=str(WORK_DIR), help="logs and checkpoints (emptied first)")
    p.add_argument("--out", default=str(RESULTS_DIR / "elastic.md"), help="table; raw results next to it (.json)")
    p.add_argument("--report", help="re-render the tables of an earlier run's .json")
    p.add_argument("--from-logs", action="store_true", help="analyse the logs in --work-dir again, run nothing")
    p.add_argument("--admit-windows", type=lambda s: [float(w) for w in s.split(",")], default=None,
                   metavar="W1,W2", help="run the elastic job once per kungfu-run --admit-window value "
                   "(seconds; default: once, with kungfu-run's default)")  # fmt: skip
    p.add_argument("--note", help="a sentence for the table's header (e.g. the machine's load)")
    p.add_argument("--worker-env", action="append", default=[], metavar="KEY=VALUE",
                   help="set in every worker's environment (repeatable), e.g. KUNGFU_AUTO_PROBES=0; the "
                   "benchmark's own KUNGFU_* variables are not passed on")  # fmt: skip
    args = p.parse_args(argv)
    for item in args.worker_env:
        try:
            parse_env_item(item)
        except ValueError as e:
            p.error(str(e))
    for m in args.models:
        if m not in MODELS:
            p.error(f"--models: unknown model {m!r}; choose from {', '.join(MODELS)}")
    for m in args.modes:
        if m not in MODES:
            p.error(f"--modes: unknown mode {m!r}; choose from {', '.join(MODES)}")
    if args.admit_windows is not None and any(not 0 <= w < float("inf") for w in args.admit_windows):
        p.error(f"--admit-windows: each must be a number of seconds >= 0, got {args.admit_windows}")
    if args.repeats < 1 or args.steps < 3:
        p.error(f"--repeats must be >= 1 and --steps >= 3, got {args.repeats} and {args.steps}")
    try:
        check_schedule(args.transitions)
    except ValueError as e:
        p.error(f"--transitions: {e}")
    return args


def model_info(model: str) -> str:
    hidden = MODELS[model]
    dims = (64, *hidden, 10)
    params = sum(a * b + b for a, b in itertools.pairwise(dims))
    return f"MLP {'-'.join(map(str, dims))}, {params / 1e6:.2f} M parameters"


def analyse(out: dict[str, Any], labels: Sequence[str], mode: str) -> dict[str, Any]:
    """``out`` (a run's records, launcher times, error) with its transitions, errors and restart break-down."""
    try:
        trans, why = measured_transitions(out["records"], labels)
    except ValueError as e:  # logs that do not fit the schedule: report, go on with the next
        trans, why = [], f"logs not analysable: {e}"
    out["error"] = "; ".join(x for x in (out.get("error"), why) if x) or None
    if mode == "restart" and "jobs" in out and trans:
        out["breakdown"] = restart_breakdown(out, trans)
    out["transitions"] = [t.to_dict() for t in trans]
    out["records"] = len(out["records"])  # the logs stay in the work directory
    for t in trans:
        log(f"  {t.label}: idle {t.idle_s:.3f} s (gap {t.gap_s:.3f} s - step {t.step_s:.3f} s)"
            + (f", detection {t.detection_s:.3f} s" if t.detection_s is not None else ""))  # fmt: skip
    if out["error"]:
        log(f"  {mode}: {out['error']}")
    return out


def variants(args: argparse.Namespace) -> list[tuple[str, str, float | None]]:
    """(table name, model, admit window or None) for every table of the run.

    Example:
        >>> variants(parse_args(["--models", "digits-mlp", "--admit-windows", "5,0"]))[1]
        ('digits-mlp, --admit-window 0', 'digits-mlp', 0.0)
    """
    if args.admit_windows is None:
        return [(m, m, None) for m in args.models]
    return [(f"{m}, --admit-window {w:g}", m, w) for m in args.models for w in args.admit_windows]


def run(args: argparse.Namespace) -> dict[str, Any]:
    labels = list(args.transitions) * args.repeats
    tables = variants(args)
    results: dict[str, Any] = {"meta": machine_metadata(), "args": vars(args), "transitions": labels,
                               "model_info": {name: model_info(m) for name, m, _ in tables}, "models": {}}  # fmt: skip
    restarts: dict[str, dict[str, Any]] = {}  # checkpoint-restart does not depend on the window: once per model
    for name, model, window in tables:
        res = results["models"][name] = {}
        for mode in args.modes:
            if mode == "restart" and model in restarts:
                res[mode] = restarts[model]
                continue
            sub = model if window is None or mode == "restart" else f"{model}-admit-window-{window:g}"
            work = Path(args.work_dir) / sub / mode
            if args.from_logs:
                out = {"records": read_logs(work / "logs"), "error": None}
                if (work / "jobs.json").exists():
                    out["jobs"] = json.loads((work / "jobs.json").read_text())
                res[mode] = analyse(out, labels, mode)
                continue
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            log(f"{name}, {mode}: {len(labels)} transitions ...")
            try:
                if mode == "elastic":
                    out = run_elastic_job(args, model, labels, work, window)
                    if out["rc"] != 0:
                        out["error"] = f"the elastic job exited with status {out['rc']} (see {work}/job.out)"
                else:
                    out = run_restart_chain(args, model, labels, work)
            except RuntimeError as e:
                out = {"records": read_logs(work / "logs"), "error": str(e)}
            res[mode] = analyse(out, labels, mode)
            if mode == "restart":
                restarts[model] = res[mode]
    results["loadavg_end"] = os.getloadavg()
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        results = json.loads(Path(args.report).read_text())
    else:
        results = run(args)
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    text = header(results) + "\n\n" + markdown(results) + "\n"
    print("\n" + text, flush=True)
    if not args.report:
        Path(args.out).write_text(text)
        log(f"table: {args.out}; raw: {Path(args.out).with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
