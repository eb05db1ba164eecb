"""Optimizers that build their slots in their first step, in an elastic custom loop (models/elastic_train.py).

``kungfu-run --elastic -np 3 --max-np 3``: the worker of rank 1 is SIGKILLed as step 4 begins, the survivors
recover on 2 workers, the launcher starts a replacement, and at step 10 the survivors wait for it
(``resize(3, wait=True)``). The replacement's warm-up builds its slots; it must be admitted (its model
signature equals the job's) and receive the members' slots. Checked: the final weights of the three final
workers are identical and equal a one-process run of the same steps with the same optimizer, slots
carried from step to step.

Forms of ``ElasticState`` (the Keras test covers ``model=, optimizer=`` with Adam):

* ``callable`` with SGD + momentum, slots built lazily: the job's signature was taken at the first
  sync, before the slots existed, and every replacement was rejected ("the job has no such line"):
  the signature now grows after the first step;
* ``list`` with Adam: a fixed list sees only what exists when it is made, so the optimizer is built first;
* ``model`` (``ElasticState(model=, optimizer=)``) with Keras's ``LossScaleOptimizer`` around SGD + momentum:
  variables of its own (loss scale, growth counter, an iteration count) besides the inner optimizer's slots.
  The step scales the loss and the scale doubles every 3 finite steps, so the scale a joiner receives is
  not the one its warm-up left.

Every case also checks that the final workers hold bitwise the same state (every variable the
``ElasticState`` holds: slots, counters, the loss scale), not only the same weights.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import describe, run_job
from elastic_records import (
    MODELS,
    final_weights,
    load,
    reference_training,
    steps_by_index,
)

SAMPLES, BATCH, EPOCHS, HIDDEN = 96, 4, 2, 16


@pytest.mark.parametrize(
    ("form", "optimizer", "lr"),
    [("callable", "momentum", 0.05), ("list", "adam", 0.01), ("model", "lossscale", 0.05)],
)
def test_a_replacement_with_lazily_built_slots_is_admitted_and_trains_in_step(tmp_path, form, optimizer, lr):
    args = ["--api", "function", "--state-form", form, "--optimizer", optimizer, "--samples", SAMPLES,
            "--batch-size", BATCH, "--epochs", EPOCHS, "--hidden", HIDDEN, "--lr", lr, "--crash-at", 4,
            "--crash-rank", 1, "--resize-at", "10:3", "--resize-wait", "--record-dir", tmp_path]  # fmt: skip
    rc, out, err = run_job(3, MODELS / "elastic_train.py", *args, timeout=150,
                           extra_launcher_args=["--elastic", "--max-np", "3"])  # fmt: skip
    report = describe(rc, out, err)
    assert rc == 0, report
    assert "has a different model" not in err, report
    records = load(tmp_path)
    steps = steps_by_index(records)
    assert [len(steps[s]) for s in (3, 4, 9, 10)] == [3, 2, 2, 3], report
    ends = {stem: lines[-1] for stem, lines in records.items() if lines and lines[-1]["event"] == "end"}
    assert len(ends) == 3 and len({e["weights_sha256"] for e in ends.values()}) == 1, report
    assert len({e["state_sha256"] for e in ends.values()}) == 1, ends  # slots and counters too
    model, opt = reference_training(steps, SAMPLES, HIDDEN, lr, optimizer)
    if optimizer == "lossscale":  # the scale one process ends with (it grew: see models/elastic_train.py)
        want_scale = float(opt.dynamic_scale.numpy())
        assert want_scale > opt.initial_scale and {e["loss_scale"] for e in ends.values()} == {want_scale}, ends
    for got, ref in zip(final_weights(tmp_path, next(iter(ends))), [w.numpy() for w in model.trainable_weights]):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
