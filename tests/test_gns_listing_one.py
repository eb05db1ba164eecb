"""KungFu's Listing 1 end to end: ``GNSResizePolicy`` grows an elastic job as the gradient noise scale grows.

``kungfu-run --elastic -np 1 --max-np 3`` (tests/workers/gns_listing_one.py): linear regression trained
with SGD, so the GNS grows as the weights approach the optimum. Checked from the records of every worker:

* every decision is Listing 1's rule applied to the GNS that the workers recorded at that step
  (``new = min(int(size * g / g0), 3)`` with ``g0`` the GNS of the previous check, and ``size`` the
  size asked for while a growth is pending);
* the cluster grew from 1 to 3 workers; every step was trained by exactly ``size`` workers, ranks
  0..size-1, with the same GNS and the same weights on all of them (the joiners took the members'
  smoothed monitor state and the policy's reference with the training state);
* the final weights equal a numpy replay of SGD over the same global batches at the recorded sizes.

Before, the monitor did not survive the growth (each worker reported another GNS), which a GNS policy
sees as a disagreement; the README said Listing 1 was tested by its decision rule only.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import REPO_ROOT, describe, run_job

AFTER, EVERY, MAX_SIZE = 30, 20, 3
GREW = re.compile(r"gns ([\d.e+]+) grew x[\d.]+ since ([\d.e+]+)(?: \(from the (\d+) workers asked for\))?")


def replay(sizes: dict[int, int]) -> np.ndarray:
    import sys

    sys.path.insert(0, str(REPO_ROOT / "tests" / "workers"))
    from gns_listing_one import LR, W0, batch

    w = W0.astype(np.float32).astype(np.float64)
    for step in sorted(sizes):
        grads = []
        for rank in range(sizes[step]):
            x, y = (a.astype(np.float64) for a in batch(step, rank))
            grads.append(((x @ w - y)[:, None] * x).mean(axis=0))
        w = w - LR * np.mean(grads, axis=0)
    return w


def test_the_cluster_grows_with_the_gradient_noise_scale(tmp_path):
    record = tmp_path / "record.jsonl"
    rc, out, err = run_job(1, "gns_listing_one.py", record, AFTER, EVERY, MAX_SIZE, timeout=300,
                           extra_launcher_args=["--elastic", "--min-np", "1", "--max-np", str(MAX_SIZE)])  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    events = [json.loads(line) for line in record.read_text().splitlines()]
    steps: dict[int, list[dict]] = {}
    for e in events:
        if e["event"] == "step":
            steps.setdefault(e["step"], []).append(e)
    assert sorted(steps) == list(range(len(steps))), report
    sizes = {}
    for step, rows in steps.items():
        size = rows[0]["size"]
        assert sorted(r["rank"] for r in rows) == list(range(size)), (step, rows)
        assert len({r["gns"] for r in rows}) == 1 and len({r["checksum"] for r in rows}) == 1, (step, rows)
        sizes[step] = size
    assert sizes[0] == 1 and max(sizes.values()) == MAX_SIZE and sizes[len(steps) - 1] == MAX_SIZE, sizes

    decisions = [e for e in events if e["event"] == "decision" and e["name"] == "size"]
    assert decisions, report
    for d in decisions:
        line = next(x for x in out.splitlines() if f"step {d['step']}: size {d['old']} -> {d['new']}" in x)
        g, g0, asked = GREW.search(line).groups()
        g, g0 = float(g), float(g0)
        base = d["old"] if asked is None else int(asked)  # a check while joiners warm up scales the size asked for
        assert g == pytest.approx(steps[d["step"] - 1][0]["gns"], rel=1e-3), (line, steps[d["step"] - 1])
        assert d["new"] == min(int(base * g / g0), MAX_SIZE) > base >= d["old"], (d, g, g0)

    ends = [e for e in events if e["event"] == "end"]
    assert len(ends) == MAX_SIZE and all(not e["detached"] and e["size"] == MAX_SIZE for e in ends), ends
    assert len({tuple(e["weights"]) for e in ends}) == 1, ends
    np.testing.assert_allclose(ends[0]["weights"], replay(sizes), rtol=1e-4, atol=1e-6)
