"""benchmarks/cost_model_accuracy: the guide's measured tables are read back whole and right.

Pure Python: parses docs/guide/synchronisation-strategies.md, no workers.
"""

from __future__ import annotations

import pytest

from benchmarks.cost_model_accuracy.run import (
    BUILDERS,
    GUIDE,
    measured_tables,
    parse_time,
)


def test_both_tables_are_read_with_every_builder():
    tables = measured_tables(GUIDE.read_text())
    assert set(tables) == {"one host", "two hosts"}
    for rows in tables.values():
        assert {"ncf", "bert-small", "comm-heavy-mlp"} <= set(rows)
        assert all(len(times) == len(BUILDERS) and min(times) > 0 for times in rows.values())
    # Spot checks against the guide's cells: NCF's PS (527 ms) and ResNet-56's AllReduce (**1.65 s**), one host.
    assert tables["one host"]["ncf"][BUILDERS.index("PS")] == pytest.approx(0.527)
    assert tables["one host"]["resnet56"][BUILDERS.index("AllReduce")] == pytest.approx(1.65)


def test_times_parse_with_their_units():
    assert parse_time("**4.80 ms**") == pytest.approx(4.8e-3)
    with pytest.raises(ValueError, match="not a time"):
        parse_time("fast")
