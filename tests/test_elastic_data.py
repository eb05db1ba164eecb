"""Dynamic data partitioning end to end: each sample of each epoch trained exactly once.

One real elastic job (``kungfu-run --elastic -np 4``, worker
tests/workers/elastic_data.py) resizes 4 -> 2 -> 3 and loses a worker to
SIGKILL in the middle of a step. From the workers' logs (ids planned before
each step, positions committed after it) the test rebuilds, epoch by epoch,
the global batch of every committed step and checks it against an
independent numpy reference: the epoch's order
``default_rng([seed, epoch]).permutation(N)`` cut into consecutive batches.
The ids of the step discarded by the crash must be trained later in the same
epoch. The model itself is the second witness: the survivors' per-sample
counters all equal the number of epochs, and their weights equal a numpy
replay of the committed global batches.
"""

from __future__ import annotations

import importlib.util
import json
import time
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import numpy as np
from conftest import WORKERS_DIR, describe, run_job

Position = tuple[int, int]  # (epoch, offset)


def worker_plan() -> ModuleType:
    """tests/workers/elastic_data_plan.py: the job's data set and schedule (numpy only)."""
    spec = importlib.util.spec_from_file_location("elastic_data_plan", WORKERS_DIR / "elastic_data_plan.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_events(log_dir: Path) -> list[dict]:
    """Every JSON line of every worker process's log."""
    events = []
    for path in sorted(log_dir.glob("*.jsonl")):
        events += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return events


class TrainingLog:
    """What the workers planned and committed, keyed by position in the data."""

    def __init__(self, events: list[dict], info: str) -> None:
        self.info = info
        self.plans: dict[tuple[int, int, int, int], list[int]] = {}  # (epoch, offset, size, rank) -> ids
        self.steps: dict[tuple[int, int, int], int] = {}  # (epoch, offset, size) -> step counter
        self.committed: dict[Position, set[int]] = defaultdict(set)  # position -> cluster sizes
        for e in events:
            if e["event"] == "plan":
                where = (e["epoch"], e["offset"], e["size"])
                key = (*where, e["rank"])
                # A position, cluster size and rank always give the same ids (a replayed step too).
                assert self.plans.setdefault(key, e["ids"]) == e["ids"], f"{key}: two id lists\n{info}"
                assert self.steps.setdefault(where, e["step"]) == e["step"], f"{where}: two steps\n{info}"
            elif e["event"] == "commit":
                self.committed[(e["epoch"], e["offset"])].add(e["size"])
        assert all(len(s) == 1 for s in self.committed.values()), f"a position committed at two sizes\n{info}"

    def size_at(self, position: Position) -> int | None:
        sizes = self.committed.get(position)
        return next(iter(sizes)) if sizes else None

    def global_batch(self, epoch: int, offset: int, size: int) -> list[int]:
        """The ids of all ranks of the step planned at (epoch, offset) for ``size`` workers, in rank order."""
        missing = [r for r in range(size) if (epoch, offset, size, r) not in self.plans]
        assert not missing, f"epoch {epoch} offset {offset}: no plan logged by ranks {missing}\n{self.info}"
        return [i for r in range(size) for i in self.plans[(epoch, offset, size, r)]]

    def trained_epoch(self, epoch: int, n: int, batch_size_at) -> list[list[int]]:
        """The committed global batches of ``epoch`` in order; they must tile [0, n) with no gap or overlap."""
        offset, batches = 0, []
        while offset < n:
            size = self.size_at((epoch, offset))
            assert size is not None, f"epoch {epoch}: nothing committed at offset {offset}\n{self.info}"
            batch = self.global_batch(epoch, offset, size)
            want = min(size * batch_size_at(self.steps[(epoch, offset, size)]), n - offset)
            assert len(batch) == want, f"epoch {epoch} offset {offset}: {len(batch)} ids, want {want}\n{self.info}"
            batches.append(batch)
            offset += want
        assert offset == n, self.info
        return batches


def replay_weights(plan: ModuleType, batches: list[list[int]]) -> np.ndarray:
    """numpy: the weights after summed-gradient SGD steps on these global batches, in order."""
    x, y = plan.dataset()
    weights = np.zeros(plan.FEATURES + 1)
    for ids in batches:
        features = np.hstack([x[ids], np.ones((len(ids), 1))]).astype(np.float64)
        weights -= plan.LEARNING_RATE * features.T @ (features @ weights - y[ids])
    return weights


def test_each_sample_of_each_epoch_trained_once_through_resizes_and_a_crash(tmp_path):
    plan = worker_plan()
    started = time.monotonic()
    rc, out, err = run_job(
        4,
        "elastic_data.py",
        tmp_path,
        timeout=150,
        extra_launcher_args=["--elastic", "--min-np", "2", "--max-np", "4"],
    )
    wall = time.monotonic() - started
    events = load_events(tmp_path)
    info = describe(rc, out, err) + "\n--- events ---\n" + "\n".join(map(json.dumps, events))
    assert rc == 0, info
    replay, discarded = check_trained_exactly_once(plan, events, info)
    print(f"elastic data job: {wall:.1f} s, {len(replay)} committed steps, {len(discarded)} discarded plans")


def check_trained_exactly_once(plan: ModuleType, events: list[dict], info: str) -> tuple[list[list[int]], list]:
    """The job's logs against numpy: every sample of every epoch trained once, the schedule
    followed (4 -> 2 -> 3, a crashed step discarded and its ids trained later), and the
    three workers that finished hold numpy's weights. Returns the committed global batches
    and the discarded plans. (test_config_store.py checks its job with it too.)"""
    n, epochs = plan.N, plan.EPOCHS
    log = TrainingLog(events, info)

    # Each epoch: the committed global batches are the reference order, cut in consecutive steps.
    replay = []
    for epoch in range(epochs):
        batches = log.trained_epoch(epoch, n, plan.batch_size_at)
        order = np.random.default_rng([plan.SEED, epoch]).permutation(n).tolist()
        assert [i for b in batches for i in b] == order, f"epoch {epoch}\n{info}"
        replay += batches
    assert set(log.committed) <= {(e, o) for e in range(epochs) for o in range(n)}, info
    assert {log.size_at(p) for p in log.committed} >= {4, 2, 3}, f"not resized 4 -> 2 -> 3\n{info}"
    assert sum(e["event"] == "detached" for e in events) == 2, info

    # The killed worker's step was discarded on every survivor; its ids were trained later in the epoch.
    (kill,) = [e for e in events if e["event"] == "kill"]
    assert log.size_at((kill["epoch"], kill["offset"])) != kill["size"], f"the crashed step was committed\n{info}"
    discarded = [k for k in log.plans if log.size_at(k[:2]) != k[2]]
    assert (kill["epoch"], kill["offset"], kill["size"], kill["rank"]) in discarded, info
    for epoch, offset, _size, _rank in discarded:
        later = {
            i
            for (e, o) in log.committed
            if e == epoch and o >= offset
            for i in log.global_batch(e, o, log.size_at((e, o)))
        }
        assert set(log.plans[(epoch, offset, _size, _rank)]) <= later, f"discarded ids never trained\n{info}"

    # The models: every survivor applied each sample once per epoch, and the same updates as numpy.
    weights = replay_weights(plan, replay)
    finals = [e for e in events if e["event"] == "final"]
    assert len(finals) == 3, f"2 survivors and the replacement should finish\n{info}"
    for final in finals:
        assert final["seen"] == [float(epochs)] * n, info
        np.testing.assert_allclose(final["weights"], weights, rtol=0, atol=1e-4, err_msg=info)
    return replay, discarded
