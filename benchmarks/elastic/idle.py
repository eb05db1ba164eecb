"""Training idle time of membership transitions, from the workers' step logs (Or et al. §7.2, Table 1).

Every worker process of ``benchmarks/elastic/run.py`` appends one JSON object
per event to its own log file (:class:`StepLog`): ``step`` at the end of
each committed training step (wall-clock ``t`` from ``time.time()``: all
processes run on one host, so their clocks agree), ``kill`` just before a
worker SIGKILLs itself, ``step_failed`` when a survivor's step fails
because a peer is gone, and a few more (``start``, ``ready``, ``save``,
``restore``) for the break-down of a restart.

A *segment* is a run of steps at one membership: the steps of one job
(``job``) at one cluster version (``version``). Segments are ordered by their
first step; consecutive segments are separated by one *transition*.

Idle time of a transition (what this module computes, precisely):

* survivors = the worker processes with steps in both segments. A
  checkpoint-restart keeps no process, so there the old job's workers stand
  for the "before" side and the new job's for the "after" side;
* ``gap`` = the latest end of the first step after the transition minus the
  latest end of the last step before it (latest over the survivors: a step is
  synchronous, so every worker of a segment ends it within milliseconds);
* ``step`` = the normal step time after the transition: the median, over the
  survivors, of the times between consecutive step ends in the new segment,
  the first step after the transition excluded (it belongs to the gap), and
  so are steps during which AUTO's probe took samples (a new layout: logged
  as ``probe``, reported apart) and steps after the next change was asked
  for (joiners starting beside them: ``transition`` events);
* ``idle = gap - step``: the time the survivors trained nothing, beyond the
  one step they would have spent anyway.

For a crash, ``detection`` is the time from the victim's ``kill`` event to
the survivors' ``step_failed`` events (the median over the survivors).

Example:
    >>> recs = [{"e": "step", "t": t, "job": 0, "version": v, "peer": p, "size": n}
    ...         for t, v, n in ((1.0, 1, 2), (2.0, 1, 2), (5.0, 2, 1), (5.5, 2, 1), (6.0, 2, 1))
    ...         for p in (["a", "b"] if n == 2 else ["a"])]
    >>> (tr,) = transitions(recs, ["shrink 2 -> 1"])
    >>> tr.gap_s, tr.step_s, tr.idle_s
    (3.0, 0.5, 2.5)
"""

from __future__ import annotations

import itertools
import json
import os
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LABEL = re.compile(r"^(?P<kind>[a-z-]+) (?P<before>\d+) -> (?P<after>\d+)$")


class StepLog:
    """Append-only JSON-lines event log of one worker process (flushed per event: a SIGKILL loses nothing).

    Example:
        >>> import tempfile
        >>> d = tempfile.mkdtemp()
        >>> log = StepLog(d, "job0")
        >>> log.event("step", step=1, version=1)
        >>> [r["e"] for r in read_logs(d)]
        ['step']
    """

    def __init__(self, directory: str | os.PathLike[str], tag: str, **common: Any) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = Path(directory) / f"{tag}-{os.getpid()}.jsonl"
        self._file = open(self.path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.common = dict(common)

    def event(self, name: str, /, t: float | None = None, **fields: Any) -> None:
        """Writes ``{"e": name, "t": now or t, **common, **fields}`` as one line."""
        rec = {"e": name, "t": time.time() if t is None else t, **self.common, **fields}
        self._file.write(json.dumps(rec) + "\n")


def read_logs(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every event of every ``*.jsonl`` log in ``directory``, by time.

    A line cut short by a SIGKILL (the last one of a file) is skipped.
    """
    out: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    out.sort(key=lambda r: r["t"])
    return out


@dataclass
class Segment:
    """The steps of one job at one cluster version."""

    job: int
    version: int
    size: int
    # peer -> its step-end times in this segment, in order
    ends: dict[str, list[float]] = field(default_factory=dict)
    # peer -> AUTO's probe-sample count after each of those steps (None: not logged)
    probes: dict[str, list[int | None]] = field(default_factory=dict)
    # peer -> when each of those steps began (``t0``; None: not logged)
    starts: dict[str, list[float | None]] = field(default_factory=dict)
    # when a worker first logged ``transition`` here (the next change was asked for); None: never
    requested_t: float | None = None

    def probing(self, peer: str, before: int | None = None) -> list[bool]:
        """For each of ``peer``'s steps here: did AUTO's probe take samples during it?

        A step probed if the count after it exceeds the count after the step
        before (``before``: the count after the last step of the previous
        segment, for the first step; unknown: False).
        """
        counts = [before, *self.probes.get(peer, [None] * len(self.ends[peer]))]
        return [a is not None and b is not None and b > a for a, b in itertools.pairwise(counts)]

    @property
    def first_t(self) -> float:
        return min(ts[0] for ts in self.ends.values())

    @property
    def last_t(self) -> float:
        return max(ts[-1] for ts in self.ends.values())

    @property
    def steps(self) -> int:
        return max(len(ts) for ts in self.ends.values())


def segments(records: Iterable[dict[str, Any]]) -> list[Segment]:
    """The step records grouped by (job, version), ordered by their first step.

    ``peer`` identifies a worker process: its host:port, which a survivor keeps
    across versions (restart jobs tag theirs with the job, see benchmarks/elastic/worker.py).
    """
    by_key: dict[tuple[int, int], Segment] = {}
    requested: dict[tuple[int, int], float] = {}
    for r in records:
        if r["e"] == "transition":
            key = (int(r["job"]), int(r["version"]))
            requested[key] = min(float(r["t"]), requested.get(key, float("inf")))
        if r["e"] != "step":
            continue
        key = (int(r["job"]), int(r["version"]))
        seg = by_key.setdefault(key, Segment(job=key[0], version=key[1], size=int(r["size"])))
        if int(r["size"]) != seg.size:
            raise ValueError(f"job {key[0]} version {key[1]}: steps at sizes {seg.size} and {r['size']}")
        seg.ends.setdefault(r["peer"], []).append(float(r["t"]))
        seg.probes.setdefault(r["peer"], []).append(r.get("probe"))
        seg.starts.setdefault(r["peer"], []).append(r.get("t0"))
    for key, seg in by_key.items():
        seg.requested_t = requested.get(key)
        for peer, ts in seg.ends.items():
            order = sorted(range(len(ts)), key=ts.__getitem__)
            seg.ends[peer] = [ts[k] for k in order]
            seg.probes[peer] = [seg.probes[peer][k] for k in order]
            seg.starts[peer] = [seg.starts[peer][k] for k in order]
    return sorted(by_key.values(), key=lambda s: s.first_t)


@dataclass
class Transition:
    """The idle time of one transition (module docstring: the definitions).

    A grow may be committed as several versions (the config service admits
    each joiner when it is ready): then ``parts`` holds each version change's
    own (gap, step, idle), the survivors trained at the sizes in between, and
    ``gap_s``/``idle_s`` are the sums over the parts (``step_s`` is the
    normal step time at the final size).
    """

    label: str  # e.g. "shrink 4 -> 2"
    size_before: int
    size_after: int
    t_before: float  # latest end of the last step before
    t_after: float  # latest end of the first step after (of the last part)
    gap_s: float
    step_s: float  # normal step time after the transition
    idle_s: float  # gap_s - step_s (summed over the parts)
    survivors: list[str]  # empty for a checkpoint-restart: no process survives
    steps_before: int
    steps_after: int
    detection_s: float | None = None  # crash: kill -> survivors' step failure (median)
    probing_before: bool = False  # AUTO still probed in the last step before (the layout was not settled)
    first_step_probed: bool = False  # AUTO took samples in the first step after (part of the gap)
    probe_steps_after: int = 0  # later steps of the new segment that carried probe samples
    probe_extra_s: float = 0.0  # their time beyond the normal step (a cost of AUTO, not in idle_s)
    # The gap split where the first step after began (step logs with ``t0``; None otherwise): the pause
    # between the steps (summed over the parts: the change, the state sync) and the first step itself.
    pause_s: float | None = None
    first_step_s: float | None = None
    parts: list[dict[str, float]] = field(default_factory=list)  # one per version change: gap_s, step_s, idle_s
    merged: bool = False  # a crash whose replacement joined before any step without the victim

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_label(label: str) -> tuple[str, int, int]:
    """``"shrink 4 -> 2"`` -> ("shrink", 4, 2); ValueError naming the label otherwise.

    Example:
        >>> parse_label("crash 4 -> 3")
        ('crash', 4, 3)
    """
    m = LABEL.match(label)
    if m is None:
        raise ValueError(f"transition label {label!r} is not '<kind> <size> -> <size>'")
    return m["kind"], int(m["before"]), int(m["after"])


def _intervals(seg: Segment, peer: str) -> list[tuple[float, bool]]:
    """(time since the step before, did AUTO probe in it) for each of ``peer``'s steps but the first, up to
    the next change's request when at least two steps came before it.

    After a grow is asked for, the members train on while the joiners start
    (TensorFlow's import and the warm-up's trace take the CPU for seconds):
    those steps are slower than the size's normal step, and there are more
    of them than before the request, so they would set the median.
    """
    ends, probing = seg.ends[peer], seg.probing(peer)
    pairs = [(b, b - a, p) for (a, b), p in zip(itertools.pairwise(ends), probing[1:], strict=True)]
    cut = seg.requested_t
    before = [x for x in pairs if cut is None or x[0] <= cut]
    return [(d, p) for _, d, p in (before if len(before) >= 2 else pairs)]


def normal_step_time(seg: Segment, peers: Sequence[str]) -> float:
    """Median time between consecutive step ends of ``peers`` in ``seg``, its first step excluded.

    Steps during which AUTO's probe took samples (a layout not measured
    before) are left out when at least two others remain: they are slower
    than the layout's normal step, and counting them would make the
    transition's idle look shorter (they are reported as ``probe_*``).
    """
    pairs = [x for p in peers for x in _intervals(seg, p)]
    if not pairs:
        raise ValueError(f"job {seg.job} version {seg.version}: needs 2 steps after a transition, has {seg.steps}")
    quiet = [d for d, probing in pairs if not probing]
    return statistics.median(quiet if len(quiet) >= 2 else [d for d, _ in pairs])


def probe_cost(seg: Segment, peers: Sequence[str], normal: float) -> tuple[int, float]:
    """(steps after the first that carried AUTO's probe samples, their time beyond ``normal``): medians over
    ``peers``. A new layout's probe runs beside training after the transition (ops/runtime/auto_choices.h)."""
    per_peer = [[d for d, probing in _intervals(seg, p) if probing] for p in peers]
    if not per_peer:
        return 0, 0.0
    steps = statistics.median(len(ds) for ds in per_peer)
    extra = statistics.median(sum(d - normal for d in ds) for ds in per_peer)
    return int(steps), float(extra)


def _detection(records: Sequence[dict[str, Any]], t_before: float, t_after: float, survivors: Sequence[str]) -> float | None:
    """Median over the survivors of (their first step failure - the kill), for a kill between the two steps."""
    kills = [r["t"] for r in records if r["e"] == "kill" and t_before <= r["t"] <= t_after]
    if not kills:
        return None
    seen: dict[str, float] = {}
    for r in records:
        if r["e"] == "step_failed" and kills[0] <= r["t"] <= t_after and r["peer"] in survivors:
            seen.setdefault(r["peer"], r["t"] - kills[0])
    return statistics.median(seen.values()) if seen else None


def transitions(records: Sequence[dict[str, Any]], labels: Sequence[str], partial: bool = False) -> list[Transition]:
    """One :class:`Transition` per label, matched in order against the segments' sizes.

    Each label (``"<kind> <before> -> <after>"``) takes the segment at
    ``before`` workers and the following ones up to the first at ``after``
    (a growth may pass through rising sizes in between; anything else must
    be one version change). Sizes that do not fit raise ValueError naming the label; too few
    segments too, unless ``partial`` (then the labels that fit are returned).
    Extra segments at the end are ignored. A crash whose replacement joined
    before the survivors took a step without the victim shows as n -> n: it
    is measured as one transition (``merged``) and the following ``replace``
    label is skipped.
    """
    segs = segments(records)
    out: list[Transition] = []
    i = 0
    skip_replace = False
    for label in labels:
        kind, n_before, n_after = parse_label(label)
        if skip_replace and kind == "replace":
            skip_replace = False  # measured together with the crash before it
            continue
        j = i + 1
        if kind == "crash" and j < len(segs) and segs[i].size == segs[j].size == n_before:
            # The replacement was admitted before the survivors took a step without the victim:
            # one transition, crash and replacement together (``merged``); the replace label has none.
            out.append(_combined(records, label, segs[i : j + 1], merged=True))
            i, skip_replace = j, True
            continue
        # A growth may be admitted in steps (sizes rising towards n_after); nothing else may.
        while j < len(segs) and n_after > n_before and segs[j - 1].size < segs[j].size < n_after:
            j += 1
        if j >= len(segs):
            if partial:
                break
            raise ValueError(
                f"expected {len(labels)} transitions ({', '.join(labels)}), the logs show {len(segs) - 1}: "
                + " -> ".join(str(s.size) for s in segs)
            )
        if segs[i].size != n_before or segs[j].size != n_after:
            shown = " -> ".join(str(s.size) for s in segs[i : j + 1])
            raise ValueError(f"transition {label!r}: the logs show {shown} there")
        out.append(_combined(records, label, segs[i : j + 1]))
        i = j
    return out


def _combined(records: Sequence[dict[str, Any]], label: str, segs: Sequence[Segment], merged: bool = False) -> Transition:
    """The transition from ``segs[0]`` to ``segs[-1]`` through the segments between (module docstring)."""
    final_survivors = sorted(set.intersection(*(set(s.ends) for s in segs)))
    parts = []
    for before, after in itertools.pairwise(segs):
        survivors = sorted(set(before.ends) & set(after.ends))
        old, new = (survivors, survivors) if survivors else (list(before.ends), list(after.ends))
        t_before = max(before.ends[p][-1] for p in old)
        t_after = max(after.ends[p][0] for p in new)
        # An admission right after another leaves one step at the size between: use the final size's.
        step_seg = after if after.steps >= 2 or after is segs[-1] else segs[-1]
        step = normal_step_time(step_seg, new if step_seg is after else final_survivors or list(step_seg.ends))
        begun = [after.starts[p][0] for p in new]
        t0_after = max(begun) if begun and None not in begun else None  # type: ignore[type-var]
        parts.append({"t_before": t_before, "t_after": t_after, "gap_s": t_after - t_before, "step_s": step,
                      "idle_s": t_after - t_before - step, "survivors": survivors, "t0_after": t0_after})  # fmt: skip
    first, last = parts[0], parts[-1]
    timed = all(p["t0_after"] is not None for p in parts)
    pause = sum(p["t0_after"] - p["t_before"] for p in parts) if timed else None
    first_step = last["t_after"] - last["t0_after"] if timed else None
    start, end = segs[0], segs[-1]
    end_peers = final_survivors or list(end.ends)
    probe_steps, probe_extra = probe_cost(end, end_peers, last["step_s"])
    before_counts = {p: start.probes[p][-1] for p in start.ends}
    probing_before = any(start.probing(p)[-1] for p in start.ends)
    first_probed = any(end.probing(p, before_counts.get(p))[0] for p in end_peers)
    return Transition(
        label=label, size_before=segs[0].size, size_after=segs[-1].size, t_before=first["t_before"],
        t_after=last["t_after"], gap_s=sum(p["gap_s"] for p in parts), step_s=last["step_s"],
        idle_s=sum(p["idle_s"] for p in parts), survivors=final_survivors, steps_before=segs[0].steps,
        steps_after=segs[-1].steps, detection_s=_detection(records, first["t_before"], first["t_after"], first["survivors"]),
        parts=[{k: p[k] for k in ("gap_s", "step_s", "idle_s")} for p in parts], merged=merged,
        probing_before=probing_before, first_step_probed=first_probed, probe_steps_after=probe_steps,
        probe_extra_s=probe_extra, pause_s=pause, first_step_s=first_step,
    )  # fmt: skip
