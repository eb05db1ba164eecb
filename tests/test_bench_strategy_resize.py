"""benchmarks/strategy_resize/run.py reads the records as documented: pure Python, made-up records."""

from __future__ import annotations

import json

import pytest

from benchmarks.strategy_resize.run import measure, table


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
