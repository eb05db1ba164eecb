"""The timing protocol shared by all all-reduce benchmark workers.

A collective must be called the same number of times on every rank, so all
loop counts here are either fixed or agreed on through a collective; nothing
depends on a rank's local clock alone.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

RESULT_TAG = "RESULT "

# Fixed so that every rank performs the same number of warm-up collectives.
# The first call traces the tf.function and sets up connections; the rest
# give a per-call time estimate for choosing the loop length.
WARMUP_CALLS = 4

# Upper bound on the calls of one timed loop (sub-microsecond collectives
# would otherwise run millions of times per loop).
MAX_ITERS = 2000


@dataclass
class Timing:
    """Per-call times of one (implementation, topology, np, size) point."""

    iters: int  # collective calls per timed loop
    samples_s: list[float]  # per-call time of each repeat (loop time / iters)

    @property
    def median_s(self) -> float:
        """Median per-call time over the repeats."""
        return statistics.median(self.samples_s)


def measure(
    step: Callable[[], Any],
    materialise: Callable[[Any], None],
    barrier: Callable[[], None],
    agree_mean: Callable[[float], float],
    repeats: int,
    target_s: float,
    max_iters: int,
) -> Timing:
    """Times ``step`` (one all-reduce) as users see it.

    Each repeat is: barrier, start clock, ``iters`` calls, materialise the
    last result on the host, stop clock. In TF's default synchronous eager
    mode each call returns only after its ops ran; materialising the last
    result also covers asynchronous executors while keeping the host copies
    of the other results out of the measurement. ``iters`` is chosen so that
    one repeat lasts about
    ``target_s``; the ranks average their estimates through ``agree_mean``
    so they all run the same count.
    """
    materialise(step())  # trace + connection setup: not representative
    t0 = time.perf_counter()
    out = None
    for _ in range(WARMUP_CALLS - 1):
        out = step()
    materialise(out)
    per_call = (time.perf_counter() - t0) / (WARMUP_CALLS - 1)

    wanted = target_s / max(per_call, 1e-9)
    iters = int(agree_mean(min(max(wanted, 1.0), float(max_iters))))
    iters = max(1, min(iters, max_iters))

    samples: list[float] = []
    for _ in range(repeats):
        barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            out = step()
        materialise(out)
        samples.append((time.perf_counter() - t0) / iters)
    return Timing(iters=iters, samples_s=samples)


def emit_result(record: dict[str, Any], timing: Timing | None = None) -> None:
    """Prints one machine-readable result line (parsed by allreduce.py)."""
    rec = dict(record)
    if timing is not None:
        rec.update(asdict(timing))
        rec["median_s"] = timing.median_s
    print(RESULT_TAG + json.dumps(rec, sort_keys=True), flush=True)


def parse_results(lines: list[str]) -> list[dict[str, Any]]:
    """Extracts result records from output lines.

    Tolerates a prefix before the tag, such as the ``[rank] `` that
    ``kungfu-run`` puts in front of every worker line.
    """
    out: list[dict[str, Any]] = []
    for line in lines:
        pos = line.find(RESULT_TAG)
        if pos < 0:
            continue
        try:
            out.append(json.loads(line[pos + len(RESULT_TAG) :]))
        except json.JSONDecodeError:
            print(f"[bench] unparsable result line: {line!r}", file=sys.stderr)
    return out
