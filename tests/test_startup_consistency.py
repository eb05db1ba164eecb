"""Startup consistency and the Keras / v1 training helpers, on real jobs
(tests/workers/startup_consistency.py). One launch per cluster size; each
worker starts from rank-seeded values (checked to differ) and verifies:

* ``kungfu_tf.broadcast_variables`` eagerly (root = last rank; float32,
  int64, bool and float64 variables) and inside ``tf.function`` (returns the
  group op; a second run reuses its keys): values equal the root's initial
  values, compared with numpy; workers whose variables differ all get a
  ValueError naming their own variables, and nothing is assigned;
* ``kungfu_tf.keras.BroadcastGlobalVariablesCallback``: at on_train_begin the
  model weights (incl. BatchNorm statistics) and the optimizer variables
  (momentum slots, set rank-dependent beforehand; iteration count) equal rank
  0's initial values (gathered with all_gather), and after two epochs of
  momentum SGD on the same batches all workers are byte-identical
  (consensus); an optimizer not yet built is built and broadcast (Adam);
* ``MetricAverageCallback``: loss/mae/val_loss/val_mae of each epoch equal
  the mean of the per-worker values (which differ), on every worker, and in
  History (a callback after it);
* ``kungfu_tf.data.shard``: rank r sees r, r+size, ... of range(101) up to
  the last 101 % size elements (dropped alike by all), and the shards are
  disjoint, equally long and cover the rest;
* ``kungfu_tf.v1.BroadcastGlobalVariablesHook`` in a MonitoredTrainingSession
  (root = last rank): global variables equal the root's at the first step,
  and stay identical through Momentum training;
* ``verbose()`` / ``RankZeroOnly(ModelCheckpoint)``: only rank 0 prints a
  progress bar and writes its checkpoint (checked here on the files and the
  output too).
"""

from __future__ import annotations

import pytest
from conftest import assert_job_ok, describe, run_job

CHECKS = 57  # results each worker checks, independent of the cluster size (> 1)


@pytest.mark.parametrize("np_", [3])
def test_startup_consistency(np_, tmp_path):
    ckpts, logs = tmp_path / "ckpt", tmp_path / "logs"
    ckpts.mkdir()
    rc, out, err = run_job(np_, "startup_consistency.py", ckpts, timeout=180,
                           extra_launcher_args=["--logdir", str(logs)])
    assert_job_ok(rc, out, err, np_, CHECKS)
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-rank0.weights.h5"], describe(rc, out, err)
    # Progress bars redraw with carriage returns, so the launcher's "[r] "
    # prefix is not on every fragment: look in each rank's own log instead.
    for r in range(np_):
        log = (logs / f"rank-{r}.log").read_text()
        bar = log[log.index("progress bars start") : log.index("progress bars end")]
        assert ("/step" in bar) == (r == 0), f"rank {r} progress output: {bar!r}\n" + describe(rc, out, err)
