"""The communication-heavy MLP 1024-4096-4096-1024-10 (25,185,290 parameters).

Little compute per parameter and ~100 MB of float32 gradients per step, so
all-reduce dominates the step time: a benchmark for the communication path
rather than for the arithmetic.

Example:
    >>> build_comm_heavy_mlp(input_dim=8, hidden=(16,), num_classes=2).count_params()
    178
    >>> x, y = synthetic_comm_heavy_data(n=4, input_dim=8, num_classes=2, seed=0)
    >>> x.shape, y.shape
    ((4, 8), (4,))
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np
from synthetic_data import teacher_dataset

INPUT_DIM = 1024
HIDDEN = (4096, 4096, 1024)
NUM_CLASSES = 10


def build_comm_heavy_mlp(
    input_dim: int = INPUT_DIM, hidden: Sequence[int] = HIDDEN, num_classes: int = NUM_CLASSES
) -> keras.Model:
    """An uncompiled ReLU MLP producing class logits; the defaults give ~25 M parameters.

    Example:
        >>> build_comm_heavy_mlp().count_params()
        25185290
    """
    inputs = keras.Input(shape=(input_dim,))
    h = inputs
    for width in hidden:
        h = keras.layers.Dense(width, activation="relu")(h)
    outputs = keras.layers.Dense(num_classes)(h)
    return keras.Model(inputs, outputs, name="comm_heavy_mlp")


def synthetic_comm_heavy_data(
    n: int, input_dim: int = INPUT_DIM, num_classes: int = NUM_CLASSES, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Learnable float32 inputs [n, input_dim] and int32 labels [n] (teacher-network labels).

    Example:
        >>> x, y = synthetic_comm_heavy_data(n=2, seed=1)
        >>> x.shape, y.dtype
        ((2, 1024), dtype('int32'))
    """
    return teacher_dataset(n, input_dim, num_classes, seed=seed)
