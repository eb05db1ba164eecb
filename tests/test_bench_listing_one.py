"""benchmarks/listing_one/run.py: its analysis on made-up records, and the driver end to end at toy size.

The target accuracy is static 1's final accuracy minus the margin; the time
to reach it is the first evaluation at or above it; the speed-up is static
1's time over the run's; a growth is matched with the first size at or above
the one asked for. The toy run (static 1 and Listing 1 with at most 2
workers, a 64-unit MLP, about 180 steps each, a few seconds) checks that the
driver produces its table, plot and JSON and that they agree: sizes within
bounds, the table parses back to the rows. Whether the joiner is admitted
before so short a run ends depends on the machine's load, so the growth
itself is checked only when it arrived (tests/test_gns_listing_one.py checks
the growth end to end).
"""

from __future__ import annotations

import json

import pytest

from benchmarks.listing_one.run import (
    check_consistent,
    growths,
    markdown_table,
    parse_table,
    summary_rows,
    time_to_accuracy,
)


def run_of(points, sizes, decisions=(), batch=32, epochs=1.0, per_epoch=1000):
    """A worker's result: (time, accuracy, size) per evaluation, size changes as (step, time, size)."""
    records = [{"time_s": t, "accuracy": a, "size": s, "step": 10 * i, "samples": 100 * i, "gns": 100.0 + i,
                "batch_size": s * batch} for i, (t, a, s) in enumerate(points)]  # fmt: skip
    records[-1]["samples"] = int(epochs * per_epoch)
    return {"records": records, "sizes": [{"step": st, "time_s": t, "size": s} for st, t, s in sizes],
            "decisions": list(decisions), "args": {"epochs": epochs, "batch": batch}, "samples_per_epoch": per_epoch}  # fmt: skip


def asked(step, time_s, old, new):
    return {"step": step, "time_s": time_s,
            "text": f"step {step}: size {old} -> {new} pending: joiners are warming up [GNSResizePolicy (gns 2 grew x2 since 1)]"}  # fmt: skip


def made_up_runs():
    return {
        "static-1": run_of([(0, 0.1, 1), (10, 0.90, 1), (20, 0.96, 1), (40, 0.97, 1)], [(0, 0.0, 1)]),
        "static-4": run_of([(0, 0.1, 4), (5, 0.90, 4), (12, 0.93, 4)], [(0, 0.0, 4)]),
        "listing-one": run_of(
            [(0, 0.1, 1), (10, 0.90, 1), (15, 0.965, 2), (25, 0.96, 4)],
            [(0, 0.0, 1), (12, 11.0, 2), (25, 20.0, 4)],
            [asked(5, 6.0, 1, 2), {"step": 12, "time_s": 11.0, "text": "step 12: batch_size 32 -> 64 [resize (...)]"},
             asked(20, 16.0, 2, 3), asked(22, 17.5, 2, 4)],
        ),
    }  # fmt: skip


def test_time_to_accuracy_is_the_first_evaluation_reaching_the_target():
    recs = [{"time_s": t, "accuracy": a} for t, a in ((0, 0.1), (2, 0.9), (3, 0.85), (5, 0.95))]
    assert [time_to_accuracy(recs, x) for x in (0.9, 0.95, 0.96)] == [2, 5, None]


def test_growths_are_matched_with_the_first_size_that_reached_them():
    g = growths(made_up_runs()["listing-one"])
    assert [(x["to"], x["asked_s"], x["arrived_s"]) for x in g] == [(2, 6.0, 11.0), (3, 16.0, 20.0), (4, 17.5, 20.0)]
    ended = run_of([(0, 0.1, 1), (3, 0.5, 1)], [(0, 0.0, 1)], [asked(5, 2.0, 1, 2)])
    assert growths(ended)[0]["arrived_s"] is None


def test_summary_rows_and_the_table_that_parses_back():
    runs = made_up_runs()
    check_consistent(runs, max_np=4)
    target, rows = summary_rows(runs, margin=0.01)
    assert target == pytest.approx(0.96)
    by = {r["run"]: r for r in rows}
    assert [r["run"] for r in rows] == ["static-1", "static-4", "listing-one"]
    assert by["static-1"]["time_to_target_s"] == 20 and by["static-1"]["speedup_vs_static_1"] == 1.0
    assert by["static-4"]["time_to_target_s"] is None and by["static-4"]["speedup_vs_static_1"] is None
    assert by["listing-one"]["speedup_vs_static_1"] == pytest.approx(20 / 15)
    assert by["listing-one"]["sizes"] == "1 -> 2 -> 4" and by["listing-one"]["samples_per_s"] == pytest.approx(40)
    table = parse_table(markdown_table(target, rows))
    assert [r["workers"] for r in table] == ["1", "4", "1 -> 2 -> 4"]
    assert table[1]["time to 96.0%"] == "not reached" and table[2]["vs static 1"] == "1.33x"
    assert table[2]["final acc."] == "96.0%" and table[2]["best acc."] == "96.5%"
    assert table[2]["growths (training time)"] == "-> 2: asked 6.0 s, in 11.0 s; -> 3: asked 16.0 s, in 20.0 s; " \
                                                   "-> 4: asked 17.5 s, in 20.0 s"  # fmt: skip


@pytest.mark.parametrize(
    ("name", "sizes", "message"),
    [
        ("listing-one", [(0, 0.0, 1), (5, 1.0, 5)], "listing-one"),  # above --max-np
        ("listing-one", [(0, 0.0, 2), (5, 1.0, 1)], "the cluster only grows"),
        ("static-4", [(0, 0.0, 3)], "static-4"),
    ],
)
def test_check_consistent_names_the_run(name, sizes, message):
    runs = made_up_runs()
    runs[name]["sizes"] = [{"step": st, "time_s": t, "size": s} for st, t, s in sizes]
    with pytest.raises(AssertionError, match=message):
        check_consistent(runs, max_np=4)


def test_driver_end_to_end_at_toy_size(tmp_path):
    from conftest import REPO_ROOT

    from benchmarks.listing_one.run import main

    png, out = tmp_path / "listing_one.png", tmp_path / "listing_one.json"
    assert main(["--runs", "static-1,listing-one", "--max-np", "2", "--epochs", "2", "--copies", "2", "--hidden", "64",
                 "--unit", "step", "--every", "10", "--smoothing", "0.5", "--plot", str(png), "--json", str(out),
                 "--launch-timeout", "240"]) == 0  # fmt: skip
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert set(runs) == {"static-1", "listing-one"}
    check_consistent(runs, max_np=2)  # sizes in [1, 2], only growing; records in order; every epoch trained
    for run in runs.values():
        recs = run["records"]
        assert recs[0]["size"] == 1 and recs[-1]["samples"] == 2 * run["samples_per_epoch"]
        assert recs[-1]["accuracy"] > 0.5, recs[-1]  # it learns (chance: 0.1)
    # Listing 1 asked to grow (the smoothed GNS doubles between two checks early on); the joiner may not make it.
    grew = growths(runs["listing-one"])
    assert grew and grew[0]["to"] == 2, runs["listing-one"]["decisions"]
    if grew[0]["arrived_s"] is not None:
        after = [r for r in runs["listing-one"]["records"] if r["step"] >= grew[0]["arrived_step"]]
        assert all(r["size"] == 2 and r["batch_size"] == 64 for r in after), after
    table = parse_table((tmp_path / "listing_one.md").read_text())
    assert [r["run"] for r in table] == ["static 1 worker", "Listing 1 (GNSResizePolicy)"]
    assert [r["workers"] for r in table] == [r["sizes"] for r in result["rows"]]
    assert str(REPO_ROOT) not in (tmp_path / "listing_one.md").read_text()
