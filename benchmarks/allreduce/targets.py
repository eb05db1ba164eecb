"""The performance targets of the all-reduce issue, checked against one run.

All targets are relative to the raw transport numbers measured in the same
run (benchmarks/allreduce/raw_transport.c), so they do not depend on how fast the
machine happens to be. The yardstick is the transport the workers really use:
every benchmark worker runs on one host, where peers talk over Unix sockets,
so the raw Unix socket; raw TCP loopback only when no Unix-socket figure was
measured (comparing a Unix-socket transport with TCP flattered it: 135% of
TCP was 78% of the Unix socket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

MIB = 1 << 20


@dataclass(frozen=True)
class Target:
    """One requirement on one (np, size) point."""

    kind: Literal["bandwidth", "latency"]
    np: int
    size: int
    # bandwidth: minimum fraction of the raw exchange rate (each way);
    # latency: maximum multiple of the raw 4-byte round-trip time between
    # two CPUs (see allreduce.py run_raw for why not the same CPU).
    threshold: float

    def description(self, yardstick: str) -> str:
        """Human-readable statement of the requirement against ``yardstick`` (a transport's name)."""
        if self.kind == "bandwidth":
            return (
                f"{self.size // MIB} MiB, np={self.np}: bus bandwidth "
                f"≥ {self.threshold:.0%} of raw {yardstick} exchange (each way)"
            )
        return (
            f"{self.size} B in tf.function, np={self.np}: time "
            f"≤ {self.threshold:g}× raw {yardstick} 4-byte ping-pong RTT (cross-CPU)"
        )


# Raw transports (benchmarks/allreduce/raw_shm.cc, raw_transport.c), in order
# of preference as the yardstick: same-host workers use the shared-memory
# ring, or Unix sockets with KUNGFU_SHM=0.
YARDSTICKS: tuple[tuple[str, str], ...] = (
    ("shm", "shared-memory ring"),
    ("unix", "Unix socket"),
    ("tcp", "TCP loopback"),
)


def yardstick(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, measurements) of the raw transport to compare with.

    The shared-memory ring if it was measured (same-host peers use one),
    else the Unix socket, else TCP loopback; ("none", {}) if none was.

    Example:
        >>> yardstick({"tcp": {"exchange": {}}, "unix": {"exchange": {}}})[0]
        'Unix socket'
        >>> yardstick({"shm": {"exchange": {}}, "unix": {"exchange": {}}})[0]
        'shared-memory ring'
        >>> yardstick({"tcp": {"exchange": {}}})[0]
        'TCP loopback'
    """
    for key, name in YARDSTICKS:
        if raw.get(key):
            return name, raw[key]
    return "none", {}


TARGETS: tuple[Target, ...] = (
    Target("bandwidth", 2, 64 * MIB, 0.80),
    Target("bandwidth", 4, 64 * MIB, 0.50),
    Target("latency", 2, 4, 3.0),
    Target("latency", 4, 4, 8.0),
)

# Who is checked against each target: ours with the AUTO topology, ours with
# whichever fixed topology did best at that point, and MWMS and Open MPI's
# MPI_Allreduce for comparison.
CONTENDERS: tuple[str, ...] = ("AUTO", "best topology", "MWMS", "Open MPI")


def _pick(
    points: list[dict[str, Any]], target: Target, contender: str
) -> dict[str, Any] | None:
    """The point that represents ``contender`` for ``target``, if measured."""
    here = [p for p in points if p["np"] == target.np and p["size"] == target.size]
    if contender == "MWMS":
        cands = [p for p in here if p["impl"] == "mwms"]
    elif contender == "Open MPI":
        cands = [p for p in here if p["impl"] == "mpi"]
    elif contender == "AUTO":
        cands = [p for p in here if p["impl"] == "kungfu" and p["topology"] == "AUTO"]
    else:
        cands = [p for p in here if p["impl"] == "kungfu" and p["topology"] != "AUTO"]
    if not cands:
        return None
    # Same ordering for both kinds: the fastest point also has the highest
    # bus bandwidth, since size and np are fixed here.
    return min(cands, key=lambda p: p["median_s"])


def evaluate(points: list[dict[str, Any]], raw: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per (target, contender): ratio, MET or not, and the inputs.

    ``ratio`` is busbw / raw rate for bandwidth targets and time / raw RTT
    for latency targets, against :func:`yardstick`; it is None when either
    side was not measured.
    """
    name, measured = yardstick(raw)
    raw_rate = measured.get("exchange", {}).get("bytes_per_s_each_way")
    raw_rtt = measured.get("pingpong", {}).get("rtt_median_s")
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        for contender in CONTENDERS:
            point = _pick(points, target, contender)
            ratio: float | None = None
            met: bool | None = None
            if point is not None:
                if target.kind == "bandwidth" and raw_rate:
                    ratio = point["busbw"] / raw_rate
                    met = ratio >= target.threshold
                elif target.kind == "latency" and raw_rtt:
                    ratio = point["median_s"] / raw_rtt
                    met = ratio <= target.threshold
            out.append(
                {
                    "target": target.description(name),
                    "kind": target.kind,
                    "np": target.np,
                    "size": target.size,
                    "threshold": target.threshold,
                    "contender": contender,
                    "topology": point["topology"] if point else None,
                    "median_s": point["median_s"] if point else None,
                    "busbw": point["busbw"] if point else None,
                    "yardstick": name,
                    "raw_rate": raw_rate,
                    "raw_rtt_s": raw_rtt,
                    "ratio": ratio,
                    "met": met,
                }
            )
    return out


# ------------------------------------------------- issue 23 §1 (shared memory)

# The small-message targets are multiples of Open MPI's time, the tf.function
# one an allowance over TF's dispatch floor, the large-message ones ratios of
# bus bandwidth, all within one run.
SHM_LATENCY_VS_MPI = 5.0
SHM_FLOOR_ALLOWANCE_S = 20e-6
SHM_GAIN_OVER_SOCKETS = 1.5


def _find(points: list[dict[str, Any]], **want: Any) -> dict[str, Any] | None:
    """The first point whose fields equal ``want``."""
    for p in points:
        if all(p.get(k) == v for k, v in want.items()):
            return p
    return None


def _runtime_point(raw: dict[str, Any], np: int, size: int, transport: str) -> dict[str, Any] | None:
    """The runtime-alone AUTO point (C++, no TensorFlow) of ``transport``."""
    for p in raw.get("runtime") or []:
        if (p["np"], p["size"], p["topology"], p.get("transport", "unix")) == (np, size, "AUTO", transport):
            return p
    return None


def evaluate_shm(points: list[dict[str, Any]], raw: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of the shared-memory transport, each with both sides.

    One record per target: ``ours`` and ``reference`` (seconds, or bytes/s
    for bandwidth), their texts, ``value`` (the ratio or the excess, as
    text) and ``met``. A side not measured leaves ``ours`` or ``reference``
    None. Nothing when neither TF nor runtime points were taken.

    Example:
        >>> pts = [{"impl": "kungfu", "topology": "AUTO", "np": 2, "size": 4, "median_s": 60e-6},
        ...        {"impl": "mpi", "topology": "MPI", "np": 2, "size": 4, "median_s": 1e-6}]
        >>> [e["met"] for e in evaluate_shm(pts, {}) if e["ours"] is not None and e["reference"]]
        [False]
    """
    from benchmarks.harness.units import format_rate, format_time

    out: list[dict[str, Any]] = []

    def add(target: str, ours: float | None, ref: float | None, kind: str, limit: float) -> None:
        rec: dict[str, Any] = {"target": target, "ours": ours, "reference": ref, "met": None, "value": ""}
        if kind == "time_ratio":
            rec["ours_text"] = format_time(ours) if ours is not None else "–"
            rec["reference_text"] = format_time(ref) if ref is not None else "–"
            if ours is not None and ref:
                rec["value"] = f"{ours / ref:.1f}×"
                rec["met"] = ours / ref <= limit
        elif kind == "rate_ratio":
            rec["ours_text"] = format_rate(ours) if ours is not None else "–"
            rec["reference_text"] = format_rate(ref) if ref is not None else "–"
            if ours is not None and ref:
                rec["value"] = f"{ours / ref:.2f}×"
                rec["met"] = ours / ref >= limit
        else:  # excess over a floor, in seconds
            rec["ours_text"] = format_time(ours) if ours is not None else "–"
            rec["reference_text"] = ("floor " + format_time(ref)) if ref is not None else "–"
            if ours is not None and ref is not None:
                rec["value"] = f"floor + {format_time(ours - ref)}"
                rec["met"] = ours - ref <= limit
        out.append(rec)

    floor = (raw.get("tf_function_floor") or {}).get("median_s")
    nps = sorted({p["np"] for p in points} | {p["np"] for p in raw.get("runtime") or []})
    for n in nps:
        mpi4 = _find(points, impl="mpi", np=n, size=4)
        mpi_t = mpi4["median_s"] if mpi4 else None
        rt4 = _runtime_point(raw, n, 4, "shm")
        add(
            f"4 B, np={n}, runtime alone (AUTO): ≤ {SHM_LATENCY_VS_MPI:g}× MPI_Allreduce",
            rt4["median_s"] if rt4 else None, mpi_t, "time_ratio", SHM_LATENCY_VS_MPI,
        )
        tf4 = _find(points, impl="kungfu", topology="AUTO", np=n, size=4)
        add(
            f"4 B, np={n}, tf.function (AUTO): ≤ {SHM_LATENCY_VS_MPI:g}× MPI_Allreduce",
            tf4["median_s"] if tf4 else None, mpi_t, "time_ratio", SHM_LATENCY_VS_MPI,
        )
        # The floor measured in the same worker processes, else a lone process's (worker_kungfu.py says why).
        in_workers = _find(points, impl="kungfu_floor", np=n)
        add(
            f"4 B, np={n}, tf.function (AUTO): ≤ TF dispatch floor + {SHM_FLOOR_ALLOWANCE_S * 1e6:g} µs"
            + (" (floor in the workers)" if in_workers else ""),
            tf4["median_s"] if tf4 else None, in_workers["median_s"] if in_workers else floor, "excess",
            SHM_FLOOR_ALLOWANCE_S,
        )
        star4 = _find(points, impl="kungfu", topology="STAR", np=n, size=4)
        if in_workers and star4:
            add(
                f"4 B, np={n}, tf.function (STAR): ≤ TF dispatch floor + {SHM_FLOOR_ALLOWANCE_S * 1e6:g} µs "
                "(floor in the workers)",
                star4["median_s"], in_workers["median_s"], "excess", SHM_FLOOR_ALLOWANCE_S,
            )
        big = 64 * MIB
        tf64 = _find(points, impl="kungfu", topology="AUTO", np=n, size=big)
        tf64_unix = _find(points, impl="kungfu_unix", topology="AUTO", np=n, size=big)
        add(
            f"64 MiB, np={n}, tf.function (AUTO): bus bandwidth ≥ {SHM_GAIN_OVER_SOCKETS:g}× over Unix sockets",
            tf64["busbw"] if tf64 and "busbw" in tf64 else None,
            tf64_unix["busbw"] if tf64_unix and "busbw" in tf64_unix else None,
            "rate_ratio", SHM_GAIN_OVER_SOCKETS,
        )
        rt64, rt64_unix = _runtime_point(raw, n, big, "shm"), _runtime_point(raw, n, big, "unix")
        add(
            f"64 MiB, np={n}, runtime alone (AUTO): ≥ {SHM_GAIN_OVER_SOCKETS:g}× faster than over Unix sockets",
            big / rt64["median_s"] if rt64 else None,
            big / rt64_unix["median_s"] if rt64_unix else None,
            "rate_ratio", SHM_GAIN_OVER_SOCKETS,
        )
        mpi64 = _find(points, impl="mpi", np=n, size=big)
        add(
            f"64 MiB, np={n}, tf.function (AUTO): bus bandwidth ≥ Open MPI's",
            tf64["busbw"] if tf64 and "busbw" in tf64 else None,
            mpi64["busbw"] if mpi64 and "busbw" in mpi64 else None,
            "rate_ratio", 1.0,
        )
    return out


# Issue 23 §2: AUTO within this factor of the best fixed topology's time, at every size and np.
AUTO_VS_BEST = 1.05
FIXED_TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")


def evaluate_auto(
    points: list[dict[str, Any]], raw: dict[str, Any]
) -> list[dict[str, Any]]:
    """AUTO against the best fixed topology of the same run, per path, np and size.

    Paths: ``tf.function`` (the ``kungfu`` points) and ``runtime alone``
    (the C++ runtime over shared memory). One record per point where AUTO
    and at least one fixed topology were measured: ``best`` (its name),
    ``best_s``, ``auto_s``, ``chose`` (AUTO's agreed topology, "" if not
    reported), ``ratio`` and ``met`` (ratio ≤ AUTO_VS_BEST), and
    ``choice_ratio``: the chosen topology's own time (held fixed) over the
    best's (None if no choice was reported).

    Example:
        >>> pts = [{"impl": "kungfu", "topology": t, "np": 2, "size": 4, "median_s": s}
        ...        for t, s in (("STAR", 90e-6), ("RING", 180e-6), ("AUTO", 92e-6))]
        >>> [(e["best"], round(e["ratio"], 2), e["met"]) for e in evaluate_auto(pts, {})]
        [('STAR', 1.02, True)]
    """
    runtime = [
        dict(p, impl="runtime")
        for p in raw.get("runtime") or []
        if p.get("transport", "unix") == "shm"
    ]
    out: list[dict[str, Any]] = []
    for impl, path in (("kungfu", "tf.function"), ("runtime", "runtime alone")):
        mine = [p for p in points + runtime if p.get("impl") == impl]
        for n, size in sorted({(p["np"], p["size"]) for p in mine}):
            auto = _find(mine, topology="AUTO", np=n, size=size)
            fixed = [
                p
                for p in mine
                if p["np"] == n
                and p["size"] == size
                and p["topology"] in FIXED_TOPOLOGIES
            ]
            if auto is None or not fixed:
                continue
            best = min(fixed, key=lambda p: p["median_s"])
            ratio = auto["median_s"] / best["median_s"]
            chose = auto.get("auto_choice") or ""
            # The chosen topology's own column (if the rounds, each a job of its own, chose differently:
            # the alphabetically first of their choices, as merge_rounds lists them): separates a
            # wrong choice (it is slower than the best) from what running through AUTO costs.
            own = _find(fixed, topology=chose.split("/")[0]) if chose else None
            out.append({
                "path": path, "np": n, "size": size, "best": best["topology"], "best_s": best["median_s"],
                "auto_s": auto["median_s"], "chose": chose, "ratio": ratio, "met": ratio <= AUTO_VS_BEST,
                "choice_ratio": own["median_s"] / best["median_s"] if own else None,
            })  # fmt: skip
    return out
