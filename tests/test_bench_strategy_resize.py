"""benchmarks/strategy_resize/run.py reads the records as documented: pure Python, made-up records."""

from __future__ import annotations

import json

import pytest

from benchmarks.strategy_resize.run import measure, switch_table, table


def test_steady_step_first_step_after_each_change_and_the_gap(tmp_path):
    lines = []
    for step in range(6):
        t0 = 10.0 * step
        duration = 1.5 if step == 3 else 0.5  # step 3 follows the change: traced again
        lines.append({"event": "step", "step": step, "rank": 0, "t0": t0, "t1": t0 + duration})
        lines.append({"event": "step", "step": step, "rank": 1, "t0": t0, "t1": t0 + 9.0})  # not rank 0: ignored
    lines.append({"event": "change", "step": 3, "detached": False})
    lines.append({"event": "change", "step": 5, "detached": True})  # the worker that left: ignored
    (tmp_path / "w.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    m = measure(tmp_path)
    assert m["steady"] == pytest.approx(0.5)
    assert m["first_after"] == pytest.approx([1.5]) and m["gap"] == pytest.approx([10.0 * 3 - (10.0 * 2 + 0.5)])
    assert "| X | 500.0 | 1500 | 1000 | 9500 |" in table({"X": m})


def test_switches_are_measured_like_changes_with_the_switch_time_of_rank_0(tmp_path):
    rank0 = [{"event": "step", "step": s, "rank": 0, "t0": 10.0 * s, "t1": 10.0 * s + (2.0 if s == 2 else 0.5)}
             for s in range(4)]  # fmt: skip
    rank0.append({"event": "switch", "step": 2, "old": "PS", "new": "AllReduce", "size": 2, "seconds": 0.25})
    other = [{"event": "switch", "step": 2, "old": "PS", "new": "AllReduce", "size": 2, "seconds": 9.0}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rank0))
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(r) for r in other))  # rank 1's switch time: ignored
    m = measure(tmp_path, event="switch")
    assert m["steady"] == pytest.approx(0.5) and m["first_after"] == pytest.approx([2.0])
    assert m["switch"] == pytest.approx([0.25]) and m["gap"] == pytest.approx([20.0 - 10.5])
    assert "| PS → AllReduce | 500.0 | 2000 | 1500 | 250 | 9500 |" in switch_table("PS → AllReduce", m)
