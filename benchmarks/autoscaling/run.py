"""Autoscaling, straggler replacement and utility vs cost on real elastic jobs (``make bench-autoscaling``).

Or et al. (§7) and KungFu §6.2 (3) on this machine, with the workload of
models/autoscale_train.py (an MLP on synthetic data, one core per worker)
and CPU quotas (tests/cgroup_quota.py, cgroup v1, root):

1. **Known efficient size.** The whole job (launcher, workers, joiners) runs
   in one cgroup of ``--quota`` cores (0.6); a step takes ~50 ms of CPU and
   100 ms without (``--wait-ms``), so 2 workers about fit and a third does
   not. Static runs at 1, 2 and 3 workers against ``AutoscalingPolicy``
   (K = 1, N = 10, S = 0.3) started at 1 and at 3 (``--max-np 3``):
   completion time, worker-time (worker-seconds: every worker process alive,
   joiners warming up included; the GPU-time analogue), time to converge (from
   the launch to the settling decision) and the size it settled at.
2. **Stragglers.** 2 workers (``--max-np 3``, no job quota), the second one
   moved into a cgroup of its own once training has begun, with a quota of
   0.17 or 0.08 cores (the job's steps become about 2x and 4x slower; the
   table gives the slowdown measured without a policy): completion time with
   ``StragglerPolicy`` (replacement first, then eviction) against no policy
   and against a straggler-free run. The straggler-free and policy jobs
   train ``--straggler-samples`` (6 M: ~2 min straggler-free, so that the
   replacement's start-up of a few seconds is amortised as in Or et al.'s
   runs of minutes); the runs that keep the straggler only measure the
   slowdown and train ``--no-policy-samples`` (1.2 M; 0 skips them): every
   run is compared with the straggler-free one per sample. A second table
   splits each replacement into its phases (asked for, process up, joined,
   straggler removed, from the job's records) and the seconds lost against
   the straggler-free pace in each: detection (at the straggler's pace until
   the policy asks), start-up (the members keep training at the straggler's
   pace while the replacement starts), join to removal, and after.
3. **Utility vs cost.** The job of 1 with ``AutoscalingPolicy`` and a linear
   utility (``--utility-value`` dollars, 0 at ``--deadline`` s) at several
   prices per worker-hour: the size chosen and the completion time.

Writes markdown tables to ``--out`` (benchmarks/results/autoscaling.md), the
raw numbers to the same name .json and the cluster size over time of the
autoscaling runs to .png. One run of each configuration (no repeats: the
machine is shared; read the numbers with that in mind).

    .venv/bin/python -m benchmarks.autoscaling                 # ~20 min on 2 cores (load 3-5)
    .venv/bin/python -m benchmarks.autoscaling --quick         # half the samples, ~10 min
    .venv/bin/python -m benchmarks.autoscaling --experiments stragglers   # ~10 min (~7 with --no-policy-samples 0)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import REPO, RESULTS_DIR

sys.path.insert(0, str(REPO / "tests"))  # the shared cgroup and record helpers (as harness/hosts.py does for netns)

from autoscale_records import (
    decisions,
    load,
    of,
    size_runs,
    step_sizes,
    throughput_by_size,
)
from cgroup_quota import CpuQuota, unavailable_reason, worker_pids

from benchmarks.harness.meta import machine_metadata

SCRIPT = REPO / "models" / "autoscale_train.py"
EXPERIMENTS = ("efficient-size", "stragglers", "utility")
# The known-size job (the same as tests/test_autoscaling.py).
JOB_ARGS = ["--batch-size", "4096", "--hidden", "256", "--wait-ms", "100"]
POLICY_ARGS = ["--scale-every", "10", "--scale-by", "1", "--efficiency-threshold", "0.3"]


@dataclass
class Run:
    """One job's outcome."""

    name: str
    ok: bool
    completion_s: float  # launch to launcher exit
    training_s: float  # first step start to last step end
    worker_s: float  # sum over worker processes of their lifetime (sampled every 0.2 s)
    final_size: int
    sizes: list[int]  # the sizes visited, in order
    settle_s: float | None  # launch to the policy's settling decision (None: none)
    throughput: dict[int, float]  # samples/s at each size (autoscale_records.throughput_by_size)
    timeline: list[tuple[float, int]] = field(default_factory=list)  # (s since launch, workers alive)
    log: list[str] = field(default_factory=list)  # the policy's decisions
    note: str = ""
    samples: int = 0  # samples trained (the last step's count)
    train_start_s: float = float("nan")  # launch to the first step's start
    phases: dict[str, float] = field(default_factory=dict)  # replacement_phases(): a straggler replacement's timeline
    load: float = float("nan")  # the 1-min load average, mean over the run (sampled with the workers)


def run_job(name: str, np: int, max_np: int, samples: int, extra: Sequence[str], *, quota: float | None = None,
            straggler_quota: float | None = None, timeout: float = 400) -> Run:  # fmt: skip
    """Runs one ``kungfu-run --elastic`` job of the workload and reads what happened."""
    with tempfile.TemporaryDirectory(prefix="kf-autoscaling-") as tmp:
        record = Path(tmp) / "record.jsonl"
        cmd = [sys.executable, "-m", "kungfu_tf.run", "--elastic", "--min-np", "1", "--max-np", str(max_np),
               "-np", str(np), sys.executable, str(SCRIPT), "--samples", str(samples), "--record", str(record),
               "--quiet", *JOB_ARGS, *extra]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
        env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
        with contextlib.ExitStack() as stack:
            job_quota = stack.enter_context(CpuQuota(quota)) if quota else None
            slow = stack.enter_context(CpuQuota(straggler_quota)) if straggler_quota else None
            start = time.time()
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                    preexec_fn=job_quota.enter if job_quota else None)  # noqa: PLW1509 -- no thread runs yet (the Watcher starts after)
            watcher = Watcher(proc.pid, start, slow, record)
            watcher.start()
            try:
                out, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                out, _ = proc.communicate()
                out += f"\n(timed out after {timeout} s)"
            end = time.time()
            watcher.stop()
        records = load(record) if record.exists() else []
    ok = proc.returncode == 0 and "identical weights on all workers: True" in out
    if not ok:
        print(f"  {name}: FAILED (exit {proc.returncode})\n" + "\n".join(out.splitlines()[-30:]), flush=True)
    steps = of(records, "step")
    log = decisions(records)
    settle = next((r["t"] - start for r in of(records, "decision") if "settled at" in r["text"]), None)
    sizes = step_sizes(records)
    train_start = min(r["t0"] for r in steps) - start if steps else float("nan")
    phases = replacement_phases(records)
    if "request_s" in phases:  # the replacement's process: the first time the job had more workers after the request
        spawned = next((t - train_start for t, n in watcher.timeline if t - train_start >= phases["request_s"]
                        and n > np), None)  # fmt: skip
        if spawned is not None:
            phases["spawned_s"] = spawned
    return Run(
        name=name,
        ok=ok,
        completion_s=end - start,
        training_s=(max(r["t1"] for r in steps) - min(r["t0"] for r in steps)) if steps else float("nan"),
        worker_s=watcher.worker_seconds,
        final_size=sizes[-1] if sizes else 0,
        sizes=[s for s, _, _ in size_runs(sizes)],
        settle_s=settle,
        throughput={k: round(v) for k, v in throughput_by_size(records).items()} if steps else {},
        timeline=watcher.timeline,
        log=[x for x in log if "autoscaling:" in x or "straggler" in x.lower() or "->" in x],
        note=watcher.note,
        samples=max(r["samples"] for r in steps) if steps else 0,
        train_start_s=train_start,
        phases=phases,
        load=sum(watcher.loads) / len(watcher.loads) if watcher.loads else float("nan"),
    )


def replacement_phases(records: list[dict[str, Any]]) -> dict[str, float]:
    """The timeline of a straggler's replacement, in seconds since the first step started.

    ``request_s``: the policy asked for the replacement (rank 0's record of
    the pending growth, written right after the step that decided it);
    ``join_s``: the replacement was admitted (the first membership change
    that grew the cluster, recorded by the first worker done with the
    state sync); ``removal_s``: the straggler left (the first shrink after
    that). ``*_samples``: the samples trained by then (the last step that
    had ended). Missing keys: that event did not happen. Empty without
    steps or without a request.
    """
    steps = of(records, "step")
    growth = next((r for r in of(records, "decision") if r.get("name") == "size" and isinstance(r.get("new"), int)
                   and isinstance(r.get("old"), int) and r["new"] > r["old"]), None)  # fmt: skip
    if not steps or growth is None:
        return {}
    t0 = min(r["t0"] for r in steps)

    def samples_by(t: float) -> float:
        return float(max((r["samples"] for r in steps if r["t1"] <= t), default=0))

    phases = {"request_s": growth["t"] - t0, "request_samples": samples_by(growth["t"])}
    changes = of(records, "change")
    join = min((r["t"] for r in changes if r["new_size"] > r["old_size"] and r["t"] >= growth["t"]), default=None)
    if join is None:
        return phases
    phases.update(join_s=join - t0, join_samples=samples_by(join))
    removal = min((r["t"] for r in changes if r["new_size"] < r["old_size"] and r["t"] > join), default=None)
    if removal is not None:
        phases.update(removal_s=removal - t0, removal_samples=samples_by(removal))
    return phases


class Watcher(threading.Thread):
    """Samples the job's worker processes every 0.2 s (worker-seconds, size over time); moves the straggler."""

    def __init__(self, launcher: int, start: float, slow: CpuQuota | None, record: Path):
        super().__init__(daemon=True)
        self.launcher, self.t0, self.slow, self.record = launcher, start, slow, record
        self.worker_seconds = 0.0
        self.loads: list[float] = []  # the 1-min load average, every second
        self.timeline: list[tuple[float, int]] = []
        self.note = ""
        self._done = threading.Event()

    def run(self) -> None:
        last = time.time()
        while not self._done.is_set():
            pids = worker_pids(self.launcher)
            now = time.time()
            self.worker_seconds += len(pids) * (now - last)
            last = now
            if not self.timeline or self.timeline[-1][1] != len(pids):
                self.timeline.append((round(now - self.t0, 2), len(pids)))
            if len(self.loads) < now - self.t0:
                self.loads.append(os.getloadavg()[0])
            if self.slow is not None and not self.note and self.record.exists() and self.record.stat().st_size:
                self._slow_down(pids)  # once training runs: the straggler started like the others
            self._done.wait(0.2)

    def _slow_down(self, pids: dict[str, int]) -> None:
        """Moves the worker of initial rank 1 into the straggler's cgroup."""
        for peer, pid in pids.items():
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if b"KUNGFU_RANK=1" in env and b"KUNGFU_JOINER=1" not in env:
                    self.slow.add(pid)
                    self.note = f"straggler {peer} (pid {pid}) at {self.slow.cpus:g} cores"

    def stop(self) -> None:
        self._done.set()
        self.join()


# ------------------------------------------------------------------ experiments


def efficient_size(args: argparse.Namespace) -> list[Run]:
    runs = []
    for n in (1, 2, 3):
        runs.append(run_job(f"static {n}", n, n, args.samples, ["--policy", "none"], quota=args.quota))
        report_progress(runs[-1])
    for n in (1, 3):
        runs.append(run_job(f"autoscaling from {n}", n, 3, args.samples, ["--policy", "autoscaling", *POLICY_ARGS],
                            quota=args.quota))  # fmt: skip
        report_progress(runs[-1])
    return runs


def stragglers(args: argparse.Namespace) -> list[Run]:
    """Straggler-free, StragglerPolicy at each quota, then no policy at each (``--no-policy-samples``; 0: none)."""
    timeout = max(400.0, 6 * args.straggler_samples / 50_000)  # ~50k samples/s straggler-free on 2 idle cores
    runs = [run_job("straggler-free, 2 workers", 2, 3, args.straggler_samples, ["--policy", "none"], timeout=timeout)]
    report_progress(runs[-1])
    # The policy runs right after the straggler-free one (the load of a shared machine drifts), then the short ones.
    for slowdown, cores in args.straggler_quotas:
        extra = ["--policy", "straggler", "--scale-every", str(args.straggler_every)]
        runs.append(run_job(f"{slowdown} straggler, StragglerPolicy", 2, 3, args.straggler_samples, extra,
                            straggler_quota=cores, timeout=timeout))  # fmt: skip
        report_progress(runs[-1])
    for slowdown, cores in args.straggler_quotas if args.no_policy_samples else ():
        runs.append(run_job(f"{slowdown} straggler, no policy", 2, 3, args.no_policy_samples, ["--policy", "none"],
                            straggler_quota=cores, timeout=timeout))  # fmt: skip
        report_progress(runs[-1])
    return runs


def utility(args: argparse.Namespace) -> list[Run]:
    runs = []
    for price in args.prices:
        extra = ["--policy", "autoscaling", *POLICY_ARGS, "--utility", "linear", "--price", str(price),
                 "--utility-value", str(args.utility_value), "--deadline", str(args.deadline)]  # fmt: skip
        runs.append(run_job(f"price {price:g} $/worker-h", 1, 3, args.samples, extra, quota=args.quota))
        report_progress(runs[-1])
    return runs


def report_progress(run: Run) -> None:
    settle = "-" if run.settle_s is None else f"{run.settle_s:.1f} s"
    print(f"  {run.name}: {'ok' if run.ok else 'FAILED'}  {run.completion_s:.1f} s  {run.worker_s:.1f} worker-s  "
          f"sizes {run.sizes}  settled {settle}  {run.note}", flush=True)  # fmt: skip


# ------------------------------------------------------------------ report


def fmt(v: float | None, digits: int = 1) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.{digits}f}"  # None and NaN: "-"


def efficient_size_table(runs: list[Run]) -> str:
    best = min((r for r in runs if r.name.startswith("static") and r.ok), key=lambda r: r.worker_s, default=None)
    rows = [("| run | sizes visited | final size | converged after (s) | completion (s) | training (s) | "
             "worker-time (worker-s) | vs static 3 | samples/s at 1, 2, 3 |"),
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    static3 = next((r for r in runs if r.name == "static 3" and r.ok), None)
    for r in runs:
        vs = "-" if static3 is None else f"{100 * (r.worker_s / static3.worker_s - 1):+.0f} %"
        rates = ", ".join(str(r.throughput.get(k, "-")) for k in (1, 2, 3))
        rows.append(f"| {r.name}{'' if r.ok else ' (FAILED)'} | {' -> '.join(map(str, r.sizes))} | {r.final_size} | "
                    f"{fmt(r.settle_s)} | {fmt(r.completion_s)} | {fmt(r.training_s)} | {fmt(r.worker_s)} | {vs} | "
                    f"{rates} |")  # fmt: skip
    if best is not None:
        rows.append(f"\nLeast worker-time among the static runs: {best.name} ({best.worker_s:.1f} worker-s).")
    return "\n".join(rows)


def seconds_per_sample(run: Run) -> float:
    """Training seconds per sample (training seconds alone when the run does not say how many samples)."""
    return run.training_s / run.samples if run.samples else run.training_s


def own_pace(run: Run) -> float | None:
    """Seconds per sample of ``run`` after the straggler left (two healthy workers, at the load of that run)."""
    p = run.phases
    if not run.samples or "removal_s" not in p or run.samples <= p["removal_samples"]:
        return None
    return (run.training_s - p["removal_s"]) / (run.samples - p["removal_samples"])


def straggler_losses(run: Run, pace: float) -> dict[str, float]:
    """Seconds ``run`` lost against ``pace`` (seconds per sample) in each phase of the replacement.

    For each phase, the lost time is its duration minus the time the
    samples trained in it take at ``pace`` (the members keep training
    while the replacement starts, at the straggler's pace):
    ``detection`` from the first step to the request, ``start-up`` from
    the request to the replacement joining (its process start,
    TensorFlow, warm-up, and the state sync that admits it), ``removal``
    from the join to the straggler leaving, ``after`` from then to the
    end. They add up to ``run``'s training time minus its samples at
    ``pace``. With the run's own pace after the removal (:func:`own_pace`),
    ``after`` is 0 and a change of the machine's load between runs does
    not count. Empty if the replacement did not both join and remove the
    straggler, or the run lacks a sample count.
    """
    p = run.phases
    if not run.samples or not {"request_s", "join_s", "removal_s"} <= set(p):
        return {}
    bounds = [(0.0, 0.0), (p["request_s"], p["request_samples"]), (p["join_s"], p["join_samples"]),
              (p["removal_s"], p["removal_samples"]), (run.training_s, float(run.samples))]  # fmt: skip
    names = ("detection", "start-up", "removal", "after")
    return {n: (t1 - t0) - (s1 - s0) * pace for n, (t0, s0), (t1, s1) in zip(names, bounds, bounds[1:])}


def straggler_table(runs: list[Run]) -> str:
    """The runs against the straggler-free one (per sample: the no-policy runs may be shorter), then the phases."""
    free = next((r for r in runs if r.name.startswith("straggler-free") and r.ok), None)
    rows = [("| run | samples | completion (s) | training (s) | vs straggler-free | vs straggler-free, start-up loss "
             "excluded | worker-time (worker-s) | sizes | load | straggler |"),
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    phases = []
    for r in runs:
        vs = excluded = "-"
        pace = own_pace(r)
        lost = straggler_losses(r, pace) if pace is not None else {}
        if lost:
            phases.append((r, pace, lost))
        if free is not None:
            vs = f"{100 * (seconds_per_sample(r) / seconds_per_sample(free) - 1):+.0f} %"
            if lost:
                excluded = f"{100 * ((r.training_s - lost['start-up']) / r.samples / seconds_per_sample(free) - 1):+.0f} %"
        samples = f"{r.samples / 1e6:g} M" if r.samples else "-"
        rows.append(f"| {r.name}{'' if r.ok else ' (FAILED)'} | {samples} | {fmt(r.completion_s)} | {fmt(r.training_s)} | "
                    f"{vs} | {excluded} | {fmt(r.worker_s)} | {' -> '.join(map(str, r.sizes))} | {fmt(r.load)} | "
                    f"{r.note or '-'} |")  # fmt: skip
    if phases:
        rows += ["", ("Replacement timeline (s since the first step; the first replacement of each run) and the seconds "
                      "lost in each phase against the run's own pace after the straggler left (duration minus the time "
                      "of the samples trained in it at that pace; the load may differ between runs, not within "
                      "one):"), "",
                 ("| run | asked for | replacement process up | joined | straggler removed | start-up (asked -> joined) "
                  "| lost: detection | lost: start-up | lost: join -> removal | lost in all | overhead at its own pace |"),
                 "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r, pace, lost in phases:
            p, total = r.phases, lost["detection"] + lost["start-up"] + lost["removal"]
            rows.append(f"| {r.name} | {fmt(p['request_s'])} | {fmt(p.get('spawned_s'))} | {fmt(p['join_s'])} | "
                        f"{fmt(p['removal_s'])} | {fmt(p['join_s'] - p['request_s'])} | {fmt(lost['detection'])} | "
                        f"{fmt(lost['start-up'])} | {fmt(lost['removal'])} | {fmt(total)} | "
                        f"{100 * total / (r.samples * pace):+.1f} % |")  # fmt: skip
    return "\n".join(rows)


def utility_table(runs: list[Run]) -> str:
    rows = ["| price ($/worker-h) | sizes visited | chosen size | completion (s) | training (s) | worker-time (worker-s) |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        rows.append(f"| {r.name.split()[1]}{'' if r.ok else ' (FAILED)'} | {' -> '.join(map(str, r.sizes))} | "
                    f"{r.final_size} | {fmt(r.completion_s)} | {fmt(r.training_s)} | {fmt(r.worker_s)} |")  # fmt: skip
    return "\n".join(rows)


def plot(results: dict[str, list[Run]], path: Path) -> bool:
    """Workers alive over time of the autoscaling runs (and the static ones for reference)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [k for k in ("efficient-size", "utility") if results.get(k)]
    if not panels:
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.6), squeeze=False)
    for ax, key in zip(axes[0], panels):
        for r in results[key]:
            if not r.timeline:
                continue
            t = [p[0] for p in r.timeline] + [r.completion_s]
            n = [p[1] for p in r.timeline] + [r.timeline[-1][1]]
            ax.step(t, n, where="post", label=r.name, linestyle="--" if r.name.startswith("static") else "-")
        ax.set_xlabel("seconds since launch")
        ax.set_ylabel("worker processes")
        ax.set_title({"efficient-size": "known efficient size (2)", "utility": "utility vs cost"}[key])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def render(results: dict[str, Any], meta: dict[str, Any], args: argparse.Namespace, png: str | None) -> str:
    out = ["# Autoscaling, stragglers, utility vs cost (`make bench-autoscaling`)", "",
           (f"{meta['date']}, {meta['cpu_count']} cores, load average at the start {meta['loadavg_start']}, "
            f"TensorFlow {meta['tensorflow']}; one run per row. Workload: models/autoscale_train.py "
            f"{' '.join(JOB_ARGS)}."), ""]  # fmt: skip
    if results.get("efficient-size"):
        out += [f"## 1. Known efficient size ({args.samples} samples, job quota {args.quota:g} cores)", "",
                efficient_size_table(results["efficient-size"]), ""]  # fmt: skip
    if results.get("stragglers"):
        no_policy = f", no-policy runs {args.no_policy_samples}" if args.no_policy_samples else ", no-policy runs skipped"
        out += [(f"## 2. Stragglers ({args.straggler_samples} samples{no_policy}, 2 workers, --max-np 3, "
                f"StragglerPolicy every {args.straggler_every} steps)"), "",
                straggler_table(results["stragglers"]), ""]  # fmt: skip
    if results.get("utility"):
        out += [f"## 3. Utility vs cost (linear utility: {args.utility_value:g} $ at 0 s, 0 at {args.deadline:g} s)", "",
                utility_table(results["utility"]), ""]  # fmt: skip
    if png:
        out += [f"![workers over time]({png})", ""]
    out += ["Decisions of the autoscaling runs:", ""]
    for key in ("efficient-size", "utility", "stragglers"):
        for r in results.get(key, []):
            if r.log:
                out += [f"* {r.name}:", *[f"  * {line}" for line in r.log[:12]]]
    return "\n".join(out) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", default=",".join(EXPERIMENTS), help=f"comma-separated: {', '.join(EXPERIMENTS)}")
    p.add_argument("--samples", type=int, default=1_400_000, help="experiments 1 and 3: samples per job")
    p.add_argument("--straggler-samples", type=int, default=6_000_000,
                   help="experiment 2: samples of the straggler-free and StragglerPolicy jobs (~2 min straggler-free)")
    p.add_argument("--no-policy-samples", type=int, default=1_200_000,
                   help="experiment 2: samples of the runs that keep the straggler (compared per sample; 0 skips them)")
    p.add_argument("--straggler-every", type=int, default=5, help="experiment 2: StragglerPolicy checks every N steps")
    p.add_argument("--quota", type=float, default=0.6, help="experiments 1 and 3: the job's CPU quota (cores)")
    p.add_argument("--prices", default="0.05,1,50", help="experiment 3: prices per worker-hour")
    p.add_argument("--utility-value", type=float, default=1.0)
    p.add_argument("--deadline", type=float, default=600.0)
    p.add_argument("--quick", action="store_true", help="smaller jobs (about half the time)")
    p.add_argument("--out", default=str(RESULTS_DIR / "autoscaling.md"))
    args = p.parse_args(argv)
    args.experiments = [e.strip() for e in args.experiments.split(",") if e.strip()]
    unknown = set(args.experiments) - set(EXPERIMENTS)
    if unknown:
        p.error(f"--experiments: unknown {sorted(unknown)}; choose from {', '.join(EXPERIMENTS)}")
    args.prices = [float(x) for x in args.prices.split(",")]
    if args.quick:
        args.samples, args.straggler_samples = args.samples // 2, args.straggler_samples // 2
        args.no_policy_samples //= 2
    # A worker's step: ~50 ms of CPU + 100 ms without; measured: 0.25 cores made the job's steps 1.25x slower,
    # 0.1 cores 3.2x (the quota's CPU time left over from the sleeping part counts too).
    args.straggler_quotas = [("~2x", 0.17), ("~4x", 0.08)]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"benchmarks/autoscaling/run.py needs cgroup v1 CPU quotas: {reason}", file=sys.stderr)
        return 2
    meta = machine_metadata()
    results: dict[str, list[Run]] = {}
    for name, fn in (("efficient-size", efficient_size), ("stragglers", stragglers), ("utility", utility)):
        if name in args.experiments:
            print(f"[autoscaling] {name} ...", flush=True)
            results[name] = fn(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    has_plot = plot(results, png)
    text = render(results, meta, args, png.name if has_plot else None)
    out.write_text(text)
    raw = {"meta": meta, "args": {k: v for k, v in vars(args).items()}, "runs": {k: [asdict(r) for r in v] for k, v in results.items()}}
    out.with_suffix(".json").write_text(json.dumps(raw, indent=1, default=str))
    print(text)
    return 0 if all(r.ok for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
