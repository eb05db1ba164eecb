"""benchmarks/strategies/auto_report.py: pure Python, made-up trial records with known answers."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.strategies.auto_report import BUCKETS, auto_rows, pair_accuracy


def brute_force(trials, key):
    """(right, pairs) per bucket, counted pair by pair from the definition (the reference)."""
    done = sorted((t for t in trials if t["measured_seconds"] is not None), key=lambda t: t["measured_seconds"])
    out = [[0, 0] for _ in range(BUCKETS)]
    for i, j in itertools.permutations(range(len(done)), 2):
        a, b = done[i], done[j]
        if a["measured_seconds"] == b["measured_seconds"]:
            continue
        bucket = min(BUCKETS - 1, i * BUCKETS // len(done))
        out[bucket][1] += 1
        out[bucket][0] += (a[key] < b[key]) == (a["measured_seconds"] < b["measured_seconds"])
    return [tuple(x) for x in out]


def test_pair_accuracy_matches_the_definition_and_skips_failed_trials():
    measured = [0.9, 0.2, 0.5, None, 0.7, 0.1, 0.3, 0.8]
    predicted = [0.8, 0.3, 0.2, 0.1, 0.9, 0.15, 0.6, 0.7]
    trials = [{"measured_seconds": m, "p": p} for m, p in zip(measured, predicted)]
    assert pair_accuracy(trials, "p") == brute_force(trials, "p")
    perfect = [{"measured_seconds": m, "p": m} for m in measured if m is not None]
    assert all(right == pairs > 0 for right, pairs in pair_accuracy(perfect, "p"))


def test_auto_rows_compare_with_the_best_and_median_hand_builder_of_the_same_cell():
    def point(builder, step_s, setting="one-host", **extra):
        return {"setting": setting, "model": "ncf", "builder": builder, "step_s": step_s, **extra}

    search = {"ranker": {"chosen": "auto-3", "search_s": 90.0, "trials": [{}] * 6}}
    points = [point("AllReduce", 0.30), point("PS", 0.20), point("Parallax", 0.10), point("default", 0.05),
              point("Auto", 0.12, auto=search), point("PS", 0.01, setting="two-hosts")]  # fmt: skip
    (row,) = auto_rows(points, ["AllReduce", "PS", "Parallax"])
    assert (row["best_builder"], row["best_s"], row["median_s"]) == ("Parallax", 0.10, 0.20)
    assert (row["chosen"], row["auto_s"], row["search_s"], row["trials"]) == ("auto-3", 0.12, 90.0, 6)


def test_auto_rows_say_what_the_search_chose_before_its_confirmation_trials():
    trials = [
        {"strategy_id": "AllReduce", "measured_seconds": 0.06},  # lucky
        {"strategy_id": "PS", "measured_seconds": 0.08},
        {"strategy_id": "auto-1", "measured_seconds": None},
        {"strategy_id": "AllReduce", "measured_seconds": 0.15, "confirmation": True},
        {"strategy_id": "PS", "measured_seconds": 0.08, "confirmation": True},
    ]
    search = {"ranker": {"chosen": "PS", "search_s": 10.0, "steps": 40, "trials": trials}}
    points = [{"setting": "one-host", "model": "ncf", "builder": b, "step_s": t, **extra}
              for b, t, extra in [("AllReduce", 0.15, {}), ("PS", 0.08, {}), ("Auto", 0.08, {"auto": search})]]  # fmt: skip
    (row,) = auto_rows(points, ["AllReduce", "PS"])
    assert (row["unconfirmed"], row["chosen"], row["trials"], row["confirmations"]) == ("AllReduce", "PS", 3, 2)
    assert row["overhead_s"] == pytest.approx(10.0 - 40 * 0.08)
