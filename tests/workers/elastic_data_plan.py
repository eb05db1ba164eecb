"""The data set and schedule of tests/workers/elastic_data.py (numpy only).

The test imports this too, to rebuild what the job must have trained.
"""

from __future__ import annotations

import numpy as np

N, EPOCHS, SEED, FEATURES, LEARNING_RATE = 36, 2, 7, 3, 0.01
# Committed steps at which the schedule acts (with the cluster size it expects then):
# 4 -> 2 at step 2, 2 -> 3 at step 4, rank 1 of 3 killed in step 6, the launcher's
# replacement for it waited for at step 8 (2 -> 3). The last step (10) is short: 2 ids
# for 3 workers.
SHRINK_AT, GROW_AT, KILL_AT = 2, (4, 8), 6


def dataset() -> tuple[np.ndarray, np.ndarray]:
    """Rows x_i and targets y_i of a small linear regression."""
    rng = np.random.default_rng(SEED)
    x = rng.uniform(-1, 1, (N, FEATURES)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0], np.float32) + 0.25).astype(np.float32)
    return x, y


def batch_size_at(step: int) -> int:
    """The per-worker batch a policy would choose: it changes between steps."""
    return 2 + step % 2
