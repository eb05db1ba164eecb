"""Keras's ``exclude_from_weight_decay`` through kungfu_tf's wrappers (AdamW users exclude biases and LayerNorm).

The exclusions are not part of an optimizer's config, and every Keras wrapper
is rebuilt from the config (optimizers/_wrapping.py): they were dropped, and
every variable was decayed, silently. Checked here on each wrapper in one
process, and with real workers (tests/workers/weight_decay_exclusion.py,
np=2: AllReduce and PartitionedPS, whose shards are variables of their own)
against one process's AdamW on the union batches.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import assert_job_ok, run_job

from kungfu_tf.optimizers import (
    PairAveragingOptimizer,
    SynchronousAveragingOptimizer,
    SynchronousSGDOptimizer,
)


@pytest.mark.parametrize("wrap", [
    lambda opt: SynchronousSGDOptimizer(opt),
    lambda opt: SynchronousSGDOptimizer(opt, strategy="PSLoadBalancing"),
    lambda opt: SynchronousAveragingOptimizer(opt),
    lambda opt: PairAveragingOptimizer(opt),
], ids=["sync-sgd", "sync-sgd-strategy", "sync-averaging", "pair-averaging"])  # fmt: skip
def test_every_wrapper_keeps_the_exclusions(wrap):
    kernel = keras.Variable(np.ones((3, 2), np.float32), name="kernel")
    bias = keras.Variable(np.ones(2, np.float32), name="bias")
    scale = keras.Variable(np.ones(2, np.float32), name="scale")
    inner = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    inner.exclude_from_weight_decay(var_list=[scale], var_names=["bias"])
    opt = wrap(inner)
    assert [opt._use_weight_decay(v) for v in (kernel, bias, scale)] == [True, False, False]


def test_workers_exclude_as_one_process():
    rc, out, err = run_job(2, "weight_decay_exclusion.py", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=4 * 3)
