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


# Transports of benchmarks/allreduce/raw_transport.c, in order of preference as the yardstick.
YARDSTICKS: tuple[tuple[str, str], ...] = (("unix", "Unix socket"), ("tcp", "TCP loopback"))


def yardstick(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, measurements) of the raw transport to compare with.

    The Unix socket if it was measured (same-host peers use one), else TCP
    loopback; ("none", {}) if neither was.

    Example:
        >>> yardstick({"tcp": {"exchange": {}}, "unix": {"exchange": {}}})[0]
        'Unix socket'
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
