"""``ScalingSearch``: Or et al.'s scaling schedule (§4.1, Fig. 3) over measured cluster sizes, without TF.

Sizes are measured one at a time; after each measurement :meth:`next_move`
says which size to measure next, or that the search has settled and where:

* the first move is ``+K`` workers (``-K`` when the cluster starts at the
  upper bound);
* while the scaling condition passes from the previous size to the current
  one, add ``K`` more;
* once it fails after at least one growth passed, settle (below the start
  nothing can change the verdict: §4.1 searches down only when the first
  growth was not efficient);
* when the first growth fails (or when scaling in from the top), go to the
  next lower size without statistics until the condition from it to the next
  measured size above passes;
* settle at the largest size before the condition first fails: scanning the
  measured sizes upward from the lowest, the first ``s`` whose condition to the
  next measured size fails (the largest measured one if none fails).

The sizes visited lie on the grid ``start + i * K`` (clipped to the bounds,
which are on the grid too); each move goes to a size without statistics, so
the search ends after at most as many moves as the grid has sizes.

Example (throughput plateaus after 2 workers, S = 0.5):
    >>> from kungfu_tf.policy.scaling_search import ScalingSearch
    >>> R = {1: 100.0, 2: 190.0, 3: 195.0}
    >>> passes = lambda a, b: ((R[b] - R[a]) / (b - a)) / (R[a] / a) > 0.5
    >>> s = ScalingSearch(scale_by=1)
    >>> moves = []
    >>> size = 1
    >>> while True:
    ...     s.record(size, R[size])
    ...     move = s.next_move(size, 1, 3, passes)
    ...     moves.append((move.target, move.settled))
    ...     if move.settled:
    ...         break
    ...     size = move.target
    >>> moves
    [(2, False), (3, False), (2, True)]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Passes = Callable[[int, int], bool]


@dataclass(frozen=True)
class Move:
    """What to do after a measurement: measure ``target`` next, or (``settled``) stay at ``target`` for good."""

    target: int
    settled: bool
    why: str


class ScalingSearch:
    """The schedule's state: measured throughputs by size, the direction, the start, unreachable sizes.

    Args:
        scale_by: K, the workers added or removed per move (>= 1).
    """

    def __init__(self, scale_by: int = 1):
        if isinstance(scale_by, bool) or not isinstance(scale_by, int) or scale_by <= 0:
            raise ValueError(f"ScalingSearch: scale_by must be a positive int, got {scale_by!r}")
        self.scale_by = scale_by
        self.start: int | None = None
        self.direction = "up"
        self.throughputs: dict[int, float] = {}
        self.unreachable: set[int] = set()

    # --- statistics -----------------------------------------------------------
    def record(self, size: int, throughput: float) -> None:
        """The measured aggregate throughput at ``size`` workers (the latest measurement wins)."""
        if self.start is None:
            self.start = size
        self.throughputs[size] = float(throughput)

    def mark_unreachable(self, size: int) -> None:
        """A growth to ``size`` did not happen in time: sizes from ``size`` up are not tried again."""
        self.unreachable.add(size)

    def upper(self, hi: int | None) -> int | None:
        """``hi`` lowered below the smallest unreachable size."""
        if self.unreachable:
            cap = min(self.unreachable) - 1
            return cap if hi is None else min(hi, cap)
        return hi

    def grid(self, lo: int, hi: int | None, around: int) -> list[int]:
        """The sizes the schedule may visit within ``[lo, hi]`` (hi None: up to ``around + K``)."""
        start = self.start if self.start is not None else around
        top = hi if hi is not None else max(around, *self.throughputs, start) + self.scale_by
        sizes = {s for s in range(start % self.scale_by or self.scale_by, top + 1, self.scale_by) if lo <= s <= top}
        sizes.add(lo)
        if hi is not None:
            sizes.add(hi)
        return sorted(s for s in sizes if lo <= s <= top)

    # --- decisions ------------------------------------------------------------
    def settle_size(self, lo: int, hi: int | None, passes: Passes) -> int:
        """Scanning the measured sizes in ``[lo, hi]`` upward: the first whose condition to the next fails."""
        known = self._known(lo, hi)
        for a, b in itertools.pairwise(known):
            if not passes(a, b):
                return a
        return known[-1]

    def next_move(self, current: int, lo: int, hi: int | None, passes: Passes) -> Move:
        """After measuring ``current`` workers: the next size to measure, or where to settle.

        ``lo``/``hi`` bound the sizes (hi None: unbounded); ``passes(a, b)``
        is the scaling condition from ``a`` to ``b > a`` measured workers.
        """
        if current not in self.throughputs:
            raise ValueError(f"ScalingSearch.next_move: no throughput recorded at the current size {current}")
        hi = self.upper(hi)
        if hi is not None and hi < lo:
            return Move(current, True, f"no size within the bounds [{lo}, {hi}]")
        if current < lo or (hi is not None and current > hi):
            target = lo if current < lo else hi
            assert target is not None
            if target in self.throughputs:
                return self._settle(lo, hi, passes, f"size {current} is outside [{lo}, {hi}]")
            return Move(target, False, f"size {current} is outside [{lo}, {hi}]")
        grid = self.grid(lo, hi, current)
        above = next((k for k in self._known(lo, hi) if k > current), None)
        below = next((k for k in reversed(self._known(lo, hi)) if k < current), None)
        if self.direction == "up" and above is None:
            if below is None or passes(below, current):
                bigger = next((k for k in grid if k > current), None)
                if bigger is not None and bigger not in self.throughputs:
                    why = "first move" if below is None else f"condition {below}->{current} passed"
                    return Move(bigger, False, f"{why}: add workers")
                if below is not None:
                    return self._settle(lo, hi, passes, f"condition {below}->{current} passed at the upper bound")
                self.direction = "down"  # started at the upper bound: the first move is -K
            elif self.start is not None and below > self.start:
                return self._settle(lo, hi, passes, f"condition {below}->{current} failed after growing from {self.start}")
            else:
                self.direction = "down"
        else:
            self.direction = "down"
        if above is not None and passes(current, above):
            return self._settle(lo, hi, passes, f"condition {current}->{above} passes")
        smaller = next((k for k in reversed(grid) if k < current and k not in self.throughputs), None)
        if smaller is not None:
            why = "first move from the upper bound" if above is None and below is None else (
                f"condition {below}->{current} failed" if above is None else f"condition {current}->{above} failed")
            return Move(smaller, False, f"{why}: search down")
        return self._settle(lo, hi, passes, "no smaller size without statistics")

    def _settle(self, lo: int, hi: int | None, passes: Passes, why: str) -> Move:
        return Move(self.settle_size(lo, hi, passes), True, why)

    def _known(self, lo: int, hi: int | None) -> list[int]:
        return sorted(k for k in self.throughputs if k >= lo and (hi is None or k <= hi))

    # --- state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "direction": self.direction,
            "throughputs": {str(k): v for k, v in sorted(self.throughputs.items())},
            "unreachable": sorted(self.unreachable),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.start = state.get("start")
        self.direction = state.get("direction", "up")
        self.throughputs = {int(k): float(v) for k, v in state.get("throughputs", {}).items()}
        self.unreachable = {int(k) for k in state.get("unreachable", [])}
