"""Training with strategies (kungfu_tf/strategy + SynchronousSGDOptimizer(strategy=...)).

Multi-worker, real ``kungfu-run`` jobs:

* tests/workers/strategy_equivalence.py: every builder × every model of
  models/ (small configurations) × API (tf.function loop for all, Keras fit
  for the MLP and NCF, v1 MonitoredTrainingSession for a hand-written
  embedding graph) reaches the weights of one process on the union of the
  workers' batches (rtol 1e-4, atol 1e-5); optimizer slots of PS variables
  exist only on their owners; bf16/fp16 runs stay within 2e-2 of the
  reference; error feedback bounds the accumulated rounding error.
* tests/workers/strategy_staleness.py: stale synchronous parallel (K = 2)
  never lets a worker start step s before every worker started step
  s - K - 1, and the fast workers do run ahead; an asynchronous PS keeps
  training while a worker stalls; K = 0 equals synchronous training.
* tests/workers/strategy_stale_sparse.py: stale (K = 1) and asynchronous PS
  with an embedding table (Keras + tf.function, and a v1 graph), whose rows travel as rows both ways, end at the
  values numpy computes from every gradient every worker pushed.
* tests/workers/strategy_sparse_bytes.py: sparse PS traffic per step is far
  below the table size and does not grow with it, synchronous, stale and
  asynchronous.
* tests/workers/strategy_mismatch.py: workers holding different strategies
  fail with StrategyError before the first step.
"""

from __future__ import annotations

import re

import pytest
from conftest import assert_job_ok, run_job

MODELS = ("mlp", "comm-heavy-mlp", "bert-small", "ncf", "resnet")  # strategy_equivalence.MODELS
FIT_MODELS = ("mlp", "ncf")
BUILDERS = ("AllReduce", "PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "PartitionedAR", "Parallax")


def expected_runs(parts: str) -> set[str]:
    runs: set[str] = set()
    if "quick" in parts:
        runs |= {f"{m}/function/{b}" for m in ("mlp", "bert-small", "ncf") for b in BUILDERS}
    if "models" in parts:
        runs |= {f"{m}/function/{b}" for m in MODELS for b in BUILDERS}
        runs |= {f"{m}/keras/{b}" for m in FIT_MODELS for b in BUILDERS}
    if "v1" in parts:
        runs |= {f"v1/{b}" for b in BUILDERS}
    if "compressed" in parts:
        runs |= {"compressed/bf16", "compressed/fp16", "compressed/bf16-ef", "error-feedback"}
    return runs


def runs_of(out: str, rank: int) -> set[str]:
    return set(re.findall(rf"^\[{rank}\] ran (\S+)$", out, flags=re.MULTILINE))


@pytest.mark.parametrize("np_,parts", [(2, "models,v1,compressed"), (4, "quick")])
def test_every_builder_trains_like_one_process(np_, parts):
    rc, out, err = run_job(np_, "strategy_equivalence.py", np_, parts, timeout=900)
    counts = assert_job_ok(rc, out, err, np_)
    for r in range(np_):
        assert runs_of(out, r) == expected_runs(parts), f"rank {r} ran {sorted(runs_of(out, r))}"
        assert counts[r] > len(expected_runs(parts))


def test_staleness_bound_async_and_k0():
    rc, out, err = run_job(3, "strategy_staleness.py", timeout=300)
    counts = assert_job_ok(rc, out, err, 3)
    assert counts == dict.fromkeys(range(3), 3 + 3 + 4), out[-3000:]


def test_stale_and_async_sparse_ps_apply_every_push():
    rc, out, err = run_job(3, "strategy_stale_sparse.py", timeout=300)
    counts = assert_job_ok(rc, out, err, 3)
    assert counts == dict.fromkeys(range(3), 15), out[-3000:]


def test_sparse_ps_bytes_scale_with_touched_rows():
    rc, out, err = run_job(2, "strategy_sparse_bytes.py", timeout=300)
    counts = assert_job_ok(rc, out, err, 2)
    assert counts == {0: 0, 1: 6}, out[-3000:]


def test_different_strategies_fail_clearly():
    rc, out, err = run_job(2, "strategy_mismatch.py", timeout=120)
    counts = assert_job_ok(rc, out, err, 2)
    assert counts == {0: 1, 1: 1}, out[-3000:]
