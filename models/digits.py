"""Real, offline image data: scikit-learn's bundled 8x8 handwritten digits.

The 1797 digit images ship inside the scikit-learn wheel, so this is real data
that needs no download (useful on machines without internet). Pixels are
0..16 intensities; they are scaled to [0, 1].

Example:
    >>> x_train, y_train, x_test, y_test = load_digits_split(test_fraction=0.2, seed=0)
    >>> x_train.shape[1], x_train.shape[0] + x_test.shape[0]
    (64, 1797)
    >>> build_digits_mlp().output_shape
    (None, 10)
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

DIGITS_FEATURES = 64  # 8x8 pixels, flattened
DIGITS_CLASSES = 10


def load_digits_split(
    test_fraction: float = 0.2, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Returns (x_train, y_train, x_test, y_test): float32 [N, 64] in [0, 1], int32 labels.

    The split is a seeded random permutation, so every worker that calls this
    with the same seed sees the same train/test partition.

    Example:
        >>> x_train, y_train, x_test, y_test = load_digits_split(0.5, seed=1)
        >>> float(x_train.max()) <= 1.0, y_test.dtype
        (True, dtype('int32'))
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    # Imported here so that modules which only need the model builder do not
    # pay for (or require) scikit-learn.
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = round(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def build_digits_mlp(hidden: Sequence[int] = (128,), seed: int | None = None) -> keras.Model:
    """An uncompiled MLP from 64 pixels to 10 class logits.

    Example:
        >>> build_digits_mlp(hidden=(32, 32)).count_params()
        3466
    """
    init = keras.initializers.GlorotUniform(seed=seed)
    inputs = keras.Input(shape=(DIGITS_FEATURES,))
    h = inputs
    for width in hidden:
        h = keras.layers.Dense(width, activation="relu", kernel_initializer=init)(h)
    outputs = keras.layers.Dense(DIGITS_CLASSES, kernel_initializer=init)(h)
    return keras.Model(inputs, outputs, name="digits_mlp")
