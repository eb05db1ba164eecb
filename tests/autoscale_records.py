"""Reading the ``--record`` file of models/autoscale_train.py (shared by tests/test_autoscaling.py and
benchmarks/autoscaling/run.py, which adds tests/ to ``sys.path``).

Example:
    >>> records = load("/tmp/run.jsonl")                     # doctest: +SKIP
    >>> size_runs(step_sizes(records))                       # doctest: +SKIP
    [(1, 0, 51), (2, 51, 50), (3, 101, 13), (2, 114, 101)]
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def load(path: str | Path) -> list[dict[str, Any]]:
    """Every JSON line of the record file, in the order written."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def of(records: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [r for r in records if r["event"] == event]


def steps_by_index(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """step -> the step records of the workers that trained it."""
    steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in of(records, "step"):
        steps[r["step"]].append(r)
    return dict(sorted(steps.items()))


def step_sizes(records: list[dict[str, Any]]) -> list[int]:
    """The cluster size of each step, in step order (0, 1, ...)."""
    return [rows[0]["size"] for rows in steps_by_index(records).values()]


def size_runs(sizes: list[int]) -> list[tuple[int, int, int]]:
    """``[(size, first step, steps)]``: the sizes visited, in order."""
    runs: list[tuple[int, int, int]] = []
    for step, size in enumerate(sizes):
        if runs and runs[-1][0] == size:
            runs[-1] = (size, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((size, step, 1))
    return runs


def step_ends(records: list[dict[str, Any]]) -> dict[int, float]:
    """step -> when its last worker finished it (time.time())."""
    return {step: max(r["t1"] for r in rows) for step, rows in steps_by_index(records).items()}


def throughput_by_size(records: list[dict[str, Any]], skip: int = 2) -> dict[int, float]:
    """Aggregate samples/s at each size, from the wall time between consecutive step ends.

    The first ``skip`` steps of each run at a size (and the first step of
    the job) are left out: they include the state sync of a change. Every
    overhead between steps (policy rounds, membership checks) counts.
    """
    ends = step_ends(records)
    steps = steps_by_index(records)
    samples: dict[int, float] = defaultdict(float)
    seconds: dict[int, float] = defaultdict(float)
    for size, first, count in size_runs(step_sizes(records)):
        for step in range(max(first + skip, 1), first + count):
            batch = steps[step][0]["samples"] - steps[step - 1][0]["samples"]
            samples[size] += batch
            seconds[size] += ends[step] - ends[step - 1]
    return {k: samples[k] / seconds[k] for k in sorted(samples) if seconds[k] > 0}


def scaling_efficiency(k: int, r_k: float, k2: int, r_k2: float) -> float:
    """Or et al. §4.2.1: ``((R_k2 - R_k) / (k2 - k)) / (R_k / k)``."""
    return ((r_k2 - r_k) / (k2 - k)) / (r_k / k)


def decisions(records: list[dict[str, Any]]) -> list[str]:
    """The decision and policy log lines, in order."""
    return [r["text"] for r in of(records, "decision")]


def median_step_seconds(records: list[dict[str, Any]]) -> float:
    ends = step_ends(records)
    gaps = [ends[s] - ends[s - 1] for s in ends if s - 1 in ends]
    return statistics.median(gaps) if gaps else float("nan")
