"""Training idle time of membership transitions, from the workers' step logs (Or et al. §7.2, Table 1).

Every worker process of ``benchmarks/elastic.py`` appends one JSON object
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
  the first step after the transition excluded (it belongs to the gap);
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

    def event(self, kind: str, t: float | None = None, **fields: Any) -> None:
        """Writes ``{"e": kind, "t": now or t, **common, **fields}`` as one line."""
        rec = {"e": kind, "t": time.time() if t is None else t, **self.common, **fields}
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
    across versions (restart jobs tag theirs with the job, see elastic_worker.py).
    """
    by_key: dict[tuple[int, int], Segment] = {}
    for r in records:
        if r["e"] != "step":
            continue
        key = (int(r["job"]), int(r["version"]))
        seg = by_key.setdefault(key, Segment(job=key[0], version=key[1], size=int(r["size"])))
        if int(r["size"]) != seg.size:
            raise ValueError(f"job {key[0]} version {key[1]}: steps at sizes {seg.size} and {r['size']}")
        seg.ends.setdefault(r["peer"], []).append(float(r["t"]))
    for seg in by_key.values():
        for ts in seg.ends.values():
            ts.sort()
    return sorted(by_key.values(), key=lambda s: s.first_t)


@dataclass
class Transition:
    """The idle time of one transition (module docstring: the definitions)."""

    label: str  # e.g. "shrink 4 -> 2"
    size_before: int
    size_after: int
    t_before: float  # latest end of the last step before
    t_after: float  # latest end of the first step after
    gap_s: float
    step_s: float  # normal step time after the transition
    idle_s: float  # gap_s - step_s
    survivors: list[str]  # empty for a checkpoint-restart: no process survives
    steps_before: int
    steps_after: int
    detection_s: float | None = None  # crash: kill -> survivors' step failure (median)

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


def normal_step_time(seg: Segment, peers: Sequence[str]) -> float:
    """Median time between consecutive step ends of ``peers`` in ``seg``, its first step excluded."""
    diffs = [b - a for p in peers for a, b in zip(seg.ends[p], seg.ends[p][1:], strict=False)]
    if not diffs:
        raise ValueError(f"job {seg.job} version {seg.version}: needs 2 steps after a transition, has {seg.steps}")
    return statistics.median(diffs)


def transitions(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[Transition]:
    """One :class:`Transition` per consecutive pair of segments, labelled in order by ``labels``.

    The segments' sizes must match the labels' (``"<kind> <before> -> <after>"``)
    and there must be at least as many segments as labels + 1, or ValueError
    says which transition differs; extra segments at the end are ignored.
    """
    segs = segments(records)
    if len(segs) < len(labels) + 1:
        raise ValueError(
            f"expected {len(labels)} transitions ({', '.join(labels)}), the logs show {len(segs) - 1}: "
            + " -> ".join(str(s.size) for s in segs)
        )
    kills = [r for r in records if r["e"] == "kill"]
    failures = [r for r in records if r["e"] == "step_failed"]
    out = []
    for label, before, after in zip(labels, segs, segs[1:], strict=False):
        _, n_before, n_after = parse_label(label)
        if (before.size, after.size) != (n_before, n_after):
            raise ValueError(f"transition {label!r}: the logs show {before.size} -> {after.size} there")
        survivors = sorted(set(before.ends) & set(after.ends))
        old, new = (survivors, survivors) if survivors else (list(before.ends), list(after.ends))
        t_before = max(before.ends[p][-1] for p in old)
        t_after = max(after.ends[p][0] for p in new)
        step = normal_step_time(after, new)
        detection = None
        kill = [k for k in kills if t_before <= k["t"] <= t_after]
        if kill:
            t_kill = kill[0]["t"]
            seen = {}
            for f in failures:
                if t_kill <= f["t"] <= t_after and f["peer"] in survivors:
                    seen.setdefault(f["peer"], f["t"] - t_kill)
            detection = statistics.median(seen.values()) if seen else None
        out.append(Transition(
            label=label, size_before=before.size, size_after=after.size, t_before=t_before, t_after=t_after,
            gap_s=t_after - t_before, step_s=step, idle_s=t_after - t_before - step, survivors=survivors,
            steps_before=before.steps, steps_after=after.steps, detection_s=detection,
        ))  # fmt: skip
    return out
