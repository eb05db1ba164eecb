"""The main training job (models/train.py) under the launcher, for every API.

Two workers train the digits MLP (real data from scikit-learn, offline) with
SynchronousSGDOptimizer through a tf.function loop, Keras ``fit`` and a
tf.compat.v1 MonitoredTrainingSession. Each run must end with bit-identical
weights on both workers (the script's own consensus check, which makes it
exit non-zero otherwise) and a held-out accuracy of at least 0.85 on the real
test split (one process reaches ~0.97 with the same settings).
"""

from __future__ import annotations

import re

import pytest
from conftest import REPO_ROOT, describe, run_job

TRAIN = REPO_ROOT / "models" / "train.py"
SUMMARY = re.compile(
    r"^\[0\] model digits-mlp\s+api (\w+)\s+optimizer sync-sgd\s+workers 2 .* final loss ([0-9.]+)\s+"
    r"held-out accuracy ([0-9.]+)\s+identical weights on all workers: (\w+)$",
    re.MULTILINE,
)


@pytest.mark.parametrize("api", ["function", "keras", "v1"])
def test_train_script_each_api(api):
    rc, out, err = run_job(2, TRAIN, "--model", "digits-mlp", "--api", api, "--steps", "120", "--lr", "0.003",
                           timeout=240)
    assert rc == 0, describe(rc, out, err)
    m = SUMMARY.search(out)
    assert m, "no summary line\n" + describe(rc, out, err)
    assert m.group(1) == api
    assert m.group(4) == "True", describe(rc, out, err)
    assert float(m.group(3)) >= 0.85, f"accuracy {m.group(3)}\n" + describe(rc, out, err)
