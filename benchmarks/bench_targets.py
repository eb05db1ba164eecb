"""The performance targets of the all-reduce issue, checked against one run.

All targets are relative to the raw TCP loopback numbers measured in the
same run (benchmarks/raw_transport.c), so they do not depend on how fast the
machine happens to be.
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
    # bandwidth: minimum fraction of the raw TCP exchange rate (each way);
    # latency: maximum multiple of the raw TCP 4-byte round-trip time between
    # two CPUs (see allreduce.py run_raw for why not the same CPU).
    threshold: float

    @property
    def description(self) -> str:
        """Human-readable statement of the requirement."""
        if self.kind == "bandwidth":
            return (
                f"{self.size // MIB} MiB, np={self.np}: bus bandwidth "
                f"≥ {self.threshold:.0%} of raw TCP exchange (each way)"
            )
        return (
            f"{self.size} B in tf.function, np={self.np}: time "
            f"≤ {self.threshold:g}× raw TCP 4-byte ping-pong RTT (cross-CPU)"
        )


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
    for latency targets; it is None when either side was not measured.
    """
    tcp = raw.get("tcp", {})
    tcp_rate = tcp.get("exchange", {}).get("bytes_per_s_each_way")
    tcp_rtt = tcp.get("pingpong", {}).get("rtt_median_s")
    out: list[dict[str, Any]] = []
    for target in TARGETS:
        for contender in CONTENDERS:
            point = _pick(points, target, contender)
            ratio: float | None = None
            met: bool | None = None
            if point is not None:
                if target.kind == "bandwidth" and tcp_rate:
                    ratio = point["busbw"] / tcp_rate
                    met = ratio >= target.threshold
                elif target.kind == "latency" and tcp_rtt:
                    ratio = point["median_s"] / tcp_rtt
                    met = ratio <= target.threshold
            out.append(
                {
                    "target": target.description,
                    "kind": target.kind,
                    "np": target.np,
                    "size": target.size,
                    "threshold": target.threshold,
                    "contender": contender,
                    "topology": point["topology"] if point else None,
                    "median_s": point["median_s"] if point else None,
                    "busbw": point["busbw"] if point else None,
                    "raw_tcp_rate": tcp_rate,
                    "raw_tcp_rtt_s": tcp_rtt,
                    "ratio": ratio,
                    "met": met,
                }
            )
    return out
