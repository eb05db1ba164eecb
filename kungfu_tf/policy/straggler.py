"""``StragglerPolicy``: replace a persistently slow worker, keeping the cluster size (Or et al. §5, Algorithm 1).

Example:
    >>> from kungfu_tf.policy import StragglerPolicy
    >>> policy = StragglerPolicy(threshold=0.8, alpha=0.1, every=10)
    >>> averages = FractionAverages(alpha=0.5)
    >>> averages.record({"h:1": 100.0, "h:2": 100.0, "h:3": 25.0})  # throughput / the others' median
    {'h:1': 1.6, 'h:2': 1.6, 'h:3': 0.25}
    >>> averages.averages["h:3"]  # new workers start at 1.0: 0.5 * 0.25 + 0.5 * 1.0
    0.625
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.context import PolicyContext

GATHER_NAME = "kungfu_policy/straggler_throughputs"


def _check_fraction(name: str, value: object, *, open_low: bool = False) -> float:
    """``value`` as a float in [0, 1] ((0, 1] with ``open_low``), else ValueError naming ``name``."""
    low = "(0" if open_low else "[0"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"StragglerPolicy: {name} must be a number in {low}, 1], got {value!r}")
    v = float(value)
    if not (0.0 < v <= 1.0 if open_low else 0.0 <= v <= 1.0):
        raise ValueError(f"StragglerPolicy: {name} must be a number in {low}, 1], got {value!r}")
    return v


def _check_int(name: str, value: object, least: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < least:
        what = "a positive int" if least == 1 else f"an int >= {least}"
        raise ValueError(f"StragglerPolicy: {name} must be {what}, got {value!r}")
    return int(value)


class FractionAverages:
    """Algorithm 1's ``record_stats``: per worker, an EWMA of its throughput as a fraction of the others' median.

    The others' median, not the median of all: with two workers the median is
    the mean of both, so a threshold of 0.8 let one worker be 1.5x slower than
    the other (its fraction 1/1.25 = 0.8) before it counted; against the
    other worker alone 0.8 means what the paper means, a 1.25x slowdown. With
    many workers the two medians barely differ, except when several are slow.

    Keyed by peer ("host:port"), not rank: ranks move when workers join or
    leave, a peer names the same process for its whole life. A worker's
    first sample is averaged with 1.0 (a new worker is presumed as fast as
    the median, so one slow first step does not condemn it). Steps with
    fewer than two measured workers say nothing about relative speed and
    are skipped.

    Example:
        >>> a = FractionAverages(alpha=0.1)
        >>> for _ in range(3):
        ...     _ = a.record({"h:1": 10.0, "h:2": 10.0, "h:3": 5.0})
        >>> round(a.averages["h:3"], 4)  # 1 - 0.5 * (1 - 0.9**3)
        0.8645
    """

    def __init__(self, alpha: float):
        self.alpha = _check_fraction("alpha", alpha, open_low=True)
        self.averages: dict[str, float] = {}

    def record(self, throughputs: Mapping[str, float]) -> dict[str, float]:
        """Updates the averages with one step's throughputs (NaN/missing: not measured); returns the fractions."""
        measured = {p: float(t) for p, t in throughputs.items() if math.isfinite(t) and t > 0}
        if len(measured) < 2:
            return {}
        fractions = {p: t / float(np.median([u for q, u in measured.items() if q != p])) for p, t in measured.items()}
        for peer, fraction in fractions.items():
            self.averages[peer] = self.alpha * fraction + (1 - self.alpha) * self.averages.get(peer, 1.0)
        return fractions

    def keep_only(self, peers: Sequence[str]) -> None:
        """Forgets the workers that are no longer members."""
        self.averages = {p: v for p, v in self.averages.items() if p in peers}

    def slowest_below(self, threshold: float, peers: Sequence[str]) -> str | None:
        """Algorithm 1's ``is_straggler``: the member with the lowest average below ``threshold`` (ties: lowest rank)."""
        below = self.all_below(threshold, peers)
        return below[0] if below else None

    def all_below(self, threshold: float, peers: Sequence[str]) -> list[str]:
        """Every member whose average is below ``threshold``, slowest first (ties: lowest rank)."""
        return [p for _, _, p in sorted((self.averages[p], i, p) for i, p in enumerate(peers)
                                        if p in self.averages and self.averages[p] < threshold)]  # fmt: skip


class StragglerPolicy(BasePolicy):
    """Detects a persistent straggler and replaces it without ever shrinking the cluster (Or et al. §5).

    After every step each worker notes its compute throughput: its local
    batch / its ``compute_time`` (the GradientMonitor's time from the start
    of the step to its gradients being ready, without the wait for its
    peers; throughput is steps/s when the runner has no ``batch_size``).
    Every ``every`` steps the workers all-gather these notes (one small
    collective), so every worker holds the same table, and replay
    Algorithm 1 over it step by step: each worker's throughput as a fraction
    of the median of the other workers' in that step, smoothed by an EWMA with ``alpha``
    (:class:`FractionAverages`), keyed by peer ("host:port") so that
    averages follow processes, not ranks, through membership changes. The
    first ``warmup_steps`` steps after each change of the cluster (and at
    the start) are not measured: they include tracing and state syncs.

    Then, with identical state on every worker (hence identical requests):

    * a member whose average is below ``threshold`` is a persistent
      straggler (a worker slow on most steps but fast every so often is
      still caught: only its average counts). Every straggler of a check is
      handled in one round (Or et al. Fig. 9 replaces up to 10 at once),
      slowest first, as many as ``--max-np`` leaves room for.
    * First replacements are asked for: ``ctx.resize(size + k)``. Growth is
      asynchronous: the launcher warms joiners up and admits them at later
      step boundaries.
    * As soon as replacements have joined (the first step after the
      cluster grew beyond the size it had when they were asked for, not
      the next check), one straggler per replacement is evicted, the
      slowest first: ``ctx.resize(workers=[every member but them])`` (they
      detach and exit). The cluster is never smaller than
      before the round. The eviction stands even if a straggler's average
      recovered while its replacement warmed up (the replacement was
      started for it).
    * At the job's ``--max-np`` there is no room for a replacement: the
      straggler is kept (and logged at every check); outside an elastic job
      likewise.
    * With two workers, a straggler must be below ``threshold`` at two
      checks in a row with the same partner. Each worker is then compared
      with the other alone, so a dip of either (a core shared with another
      job, a replacement's start-up on the same host) reads as a straggler,
      where Or et al.'s median of many workers absorbs it. A healthy worker
      recovers within a check (the 2-worker benchmark evicted four healthy
      ones at averages 0.73-0.80, back above 0.8 a check later: each
      eviction's replacement start-up caused the next dip); a real
      straggler stays below, and is replaced one check later than with
      three or more workers.

    Every check logs the averages and what was decided, or why nothing was
    (``ctx.log``; rank 0 prints and writes TensorBoard text), and puts
    ``straggler/fraction/<peer>``, ``straggler/median_throughput``,
    ``straggler/pending`` and ``straggler/replaced`` into the metrics
    (TensorBoard scalars). The averages and the pending replacement are in
    :meth:`state_dict`, so joiners continue with them.

    Why local notes and an all-gather rather than the monitor's
    ``worker_compute_times``: each worker reports its own value under its
    own peer at the check, so a membership change between a step and the
    check (ranks moved) cannot attribute a time to the wrong worker, and a
    joiner simply has no notes for the steps before it joined. Cost: the
    policy runs after every step (Algorithm 1 records every step), i.e. the
    runner's small agreement round per step, plus one all-gather of
    ``every`` floats per worker per check.

    Needs a ``GradientMonitor`` (``gns=False`` is enough) and, to act, an
    elastic job: ``kungfu-run --elastic -np N --max-np N+1``. A departed
    straggler (crash, other policy) ends a pending replacement; the
    replacement that then joined simply stays. A replacement that never
    comes (the launcher cannot start one) leaves the straggler in place.

    Args:
        threshold: in [0, 1]: the lowest tolerated average fraction of the
            others' median throughput (0.8: at most a 1.25x slowdown, with 2
            workers as with 100; 0: nobody is a straggler; 1: anybody slower
            than the others' median is).
        alpha: in (0, 1]: the EWMA weight of the newest step (0.1 in the paper).
        every: check every this many steps (Algorithm 1's N).
        warmup_steps: steps not measured after a change of the cluster.

    Example:
        >>> from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
        >>> from kungfu_tf.policy import PolicyRunner, StragglerPolicy
        >>> monitor = GradientMonitor(batch_size=32, gns=False)  # doctest: +SKIP
        >>> runner = PolicyRunner([StragglerPolicy(every=20)], batch_size=32 * kungfu_tf.size(),
        ...                       monitor=monitor)  # doctest: +SKIP
        >>> state = kungfu_tf.elastic.ElasticState(model.variables, policy=runner)  # doctest: +SKIP
    """

    needs_monitor = True

    def __init__(self, threshold: float = 0.8, alpha: float = 0.1, every: int = 10, warmup_steps: int = 2):
        self.threshold = _check_fraction("threshold", threshold)
        self.alpha = _check_fraction("alpha", alpha, open_low=True)
        self.every = _check_int("every", every, 1)
        self.warmup_steps = _check_int("warmup_steps", warmup_steps, 0)
        self._averages = FractionAverages(self.alpha)
        # The stragglers whose replacements were asked for: {"peers", "size" (the cluster size then), "step"}.
        self._pending: dict[str, Any] | None = None
        self._replaced = 0
        # The members at the last check and those below the threshold then (the two-worker rule).
        self._last_check: dict[str, list[str]] = {"peers": [], "below": []}
        # This worker's own measurements (not shared state): step -> throughput.
        self._samples: dict[int, float] = {}
        self._peers_seen: tuple[str, ...] | None = None
        self._measure_from = 0

    @property
    def averages(self) -> dict[str, float]:
        """The EWMA of each member's throughput fraction, by peer."""
        return dict(self._averages.averages)

    @property
    def pending(self) -> dict[str, Any] | None:
        """The stragglers waiting for their replacements (``peers``, the ``size`` to keep, ``step``), or None."""
        return None if self._pending is None else {**self._pending, "peers": list(self._pending["peers"])}

    def config(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "alpha": self.alpha, "every": self.every, "warmup_steps": self.warmup_steps}

    def state_dict(self) -> dict[str, Any]:
        return {
            "averages": self.averages,
            "pending": self.pending,
            "replaced": self._replaced,
            "last_check": {k: list(v) for k, v in self._last_check.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._averages.averages = {str(k): float(v) for k, v in state.get("averages", {}).items()}
        pending = state.get("pending")
        if pending is not None and "peer" in pending:  # a state saved when one straggler was handled per round
            pending = {"peers": [pending["peer"]], "size": pending["size"], "step": pending["step"]}
        self._pending = pending
        self._replaced = int(state.get("replaced", 0))
        last = state.get("last_check") or {}
        self._last_check = {"peers": [str(p) for p in last.get("peers", [])],
                            "below": [str(p) for p in last.get("below", [])]}  # fmt: skip

    # ----------------------------------------------------------- hooks

    def after_step(self, ctx: PolicyContext) -> None:
        changed = self.measure(ctx)
        if (ctx.step + 1) % self.every == 0:
            self.check(ctx)
        elif changed:
            self.follow_change(ctx)

    def measure(self, ctx: PolicyContext) -> bool:
        """Notes this worker's throughput of the step just run (skipped right after a cluster change).

        Returns True if the cluster differs from the one of this worker's
        previous step (every member sees a change at the same step; a
        joiner's first step counts as one).
        """
        peers = tuple(ctx.peers)
        changed = peers != self._peers_seen
        if changed:
            self._peers_seen = peers
            self._measure_from = ctx.step + self.warmup_steps
        if ctx.step < self._measure_from:
            return changed
        seconds = ctx.metrics.get("compute_time")
        if not isinstance(seconds, (int, float, np.integer, np.floating)) or not math.isfinite(seconds) or seconds <= 0:
            return changed
        self._samples[ctx.step] = float(ctx.local_batch_size or 1) / float(seconds)
        return changed

    def follow_change(self, ctx: PolicyContext) -> None:
        """Right after a cluster change between checks: a round in progress evicts at once, without a check.

        Waiting for the next check kept the straggler for up to ``every``
        more steps after its replacement had joined, and the cluster ran
        them at the straggler's pace. Only the round's own state and the
        peers decide (no measurement), so every member, the joiner included
        (it has the round from the state sync), decides alike at this step.
        """
        if self._pending is None:
            return
        peers = tuple(ctx.peers)
        waiting = self._pending["peers"]
        if len(peers) > int(self._pending["size"]) or any(p not in peers for p in waiting):
            self._follow_round(ctx, peers)
            ctx.metrics["straggler/pending"] = float(self._pending is not None)
            ctx.metrics["straggler/replaced"] = float(self._replaced)

    def window(self, step: int) -> np.ndarray:
        """This worker's throughputs of the ``every`` steps ending at ``step`` (NaN: not measured)."""
        return np.array([self._samples.get(s, math.nan) for s in range(step - self.every + 1, step + 1)], np.float64)

    def check(self, ctx: PolicyContext) -> None:
        """Algorithm 1 over the last ``every`` steps of every worker, then one decision (identical everywhere)."""
        mine = self.window(ctx.step)
        self._samples = {s: t for s, t in self._samples.items() if s > ctx.step}
        # Every worker's notes, by rank: the same table everywhere, whoever joined or left since.
        peers = tuple(ctx.peers)
        table = np.asarray(ctx.all_gather(mine, name=GATHER_NAME), np.float64).reshape(len(peers), self.every)
        medians = []
        for column in table.T:
            fractions = self._averages.record(dict(zip(peers, column.tolist())))
            if fractions:
                medians.append(float(np.median([t for t in column if math.isfinite(t) and t > 0])))
        self._averages.keep_only(peers)
        averages = self._averages.averages
        for peer, value in averages.items():
            ctx.metrics[f"straggler/fraction/{peer}"] = value
        ctx.metrics["straggler/median_throughput"] = medians[-1] if medians else math.nan
        shown = ", ".join(f"{p} {averages[p]:.3f}" for p in peers if p in averages) or "none measured yet"
        median = f"{medians[-1]:.4g}" if medians else "n/a"
        ctx.log(
            f"straggler check: EWMA of throughput / median: {shown} (threshold {self.threshold:g}, "
            f"{len(medians)} of {self.every} steps measured, last median {median}/s)"
        )
        self._decide(ctx, peers)
        ctx.metrics["straggler/pending"] = float(self._pending is not None)
        ctx.metrics["straggler/replaced"] = float(self._replaced)

    def _decide(self, ctx: PolicyContext, peers: tuple[str, ...]) -> None:
        size = len(peers)
        below = self._averages.all_below(self.threshold, peers)
        slow = self._confirmed(below, peers)
        if self._pending is not None:
            self._follow_round(ctx, peers)
            if self._pending is not None:
                return
        if not slow:
            if below:
                ctx.log(
                    f"{below[0]} (average {self._averages.averages[below[0]]:.3f}) is below {self.threshold:g} at its "
                    f"first check: with two workers each is compared with the other alone, so it must stay below "
                    f"at the next check too"
                )
            else:
                ctx.log(f"no straggler: every average is >= {self.threshold:g}")
            return
        named = ", ".join(f"{p} (average {self._averages.averages[p]:.3f})" for p in slow)
        bounds = ctx.size_bounds
        if bounds is None:
            ctx.log(f"straggler {named} kept: not an elastic job, no replacement can be added")
            return
        room = len(slow) if not bounds[1] else max(0, bounds[1] - size)
        if room == 0:
            ctx.log(f"straggler {named} kept: the job is at --max-np {bounds[1]}, no room for a replacement")
            return
        chosen = slow[:room]
        if len(chosen) < len(slow):
            ctx.log(f"stragglers {', '.join(slow[room:])} kept for now: --max-np {bounds[1]} leaves room for {room}")
        shown = ", ".join(f"{p} (average {self._averages.averages[p]:.3f} < {self.threshold:g})" for p in chosen)
        what = "a replacement" if len(chosen) == 1 else f"{len(chosen)} replacements"
        ctx.resize(size + len(chosen), reason=f"{what} for straggler {shown}")
        ctx.log(f"straggler {shown}: asked for {what} ({size} -> {size + len(chosen)})")
        self._pending = {"peers": chosen, "size": size, "step": ctx.step + 1}

    def _confirmed(self, below: list[str], peers: tuple[str, ...]) -> list[str]:
        """The stragglers among ``below`` (this check's members under the threshold), and remembers them.

        Three or more workers: all of them (Algorithm 1). Two: only one that
        was below at the previous check too, with the same partner (a check
        against another partner, before a change, is no evidence about this
        pair; see the class docstring).
        """
        previous = self._last_check
        self._last_check = {"peers": list(peers), "below": list(below)}
        if len(peers) != 2:
            return below
        if set(previous["peers"]) != set(peers):  # ranks may swap; the pair is what counts
            return []
        return [p for p in below if p in previous["below"]]

    def _follow_round(self, ctx: PolicyContext, peers: tuple[str, ...]) -> None:
        """A round in progress: forget stragglers that left, evict one per replacement that has joined."""
        assert self._pending is not None
        size, asked_at_size, asked_at_step = len(peers), int(self._pending["size"]), int(self._pending["step"])
        waiting = list(self._pending["peers"])
        for gone in [p for p in waiting if p not in peers]:
            self._replaced += 1
            waiting.remove(gone)
            ctx.log(f"straggler {gone} has left the cluster ({size} workers): replacement done")
        # Stragglers that left free a place each: the cluster the round must keep is smaller by as many.
        floor = asked_at_size - (len(self._pending["peers"]) - len(waiting))
        self._pending = {**self._pending, "peers": waiting, "size": floor} if waiting else None
        if not waiting:
            return
        arrived = size - floor
        if arrived > 0:
            leaving = waiting[:arrived]
            ctx.resize(
                workers=[p for p in peers if p not in leaving],
                reason=f"evict straggler {', '.join(leaving)}: the cluster grew from {floor} to {size} workers",
            )
            ctx.log(f"evicting straggler {', '.join(leaving)}: {'its replacement has' if arrived == 1 else 'replacements have'} "
                    f"joined ({floor} -> {size} workers)")  # fmt: skip
            return
        ctx.log(
            f"straggler {', '.join(waiting)}: waiting for {'its replacement' if len(waiting) == 1 else 'replacements'} "
            f"(asked at step {asked_at_step}, {size} workers); keeping {'it' if len(waiting) == 1 else 'them'} until then"
        )
