"""Learnable synthetic classification data, generated identically on every worker.

Labels come from a fixed random "teacher" network, so a student model can
reach high accuracy and the loss curve means something, with no download.

Example:
    >>> x, y = teacher_dataset(num_samples=8, features=4, classes=3, seed=0)
    >>> x.shape, y.shape
    ((8, 4), (8,))
"""

from __future__ import annotations

import numpy as np


def teacher_dataset(num_samples: int, features: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Returns float32 inputs [num_samples, features] and int32 labels [num_samples]."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_samples, features)).astype(np.float32)
    hidden = rng.standard_normal((features, 32)).astype(np.float32)
    head = rng.standard_normal((32, classes)).astype(np.float32)
    logits = np.tanh(x @ hidden) @ head
    return x, logits.argmax(axis=1).astype(np.int32)
