"""scikit-learn's digits, enlarged by seeded augmentation: a real task that ships offline.

The 1438 training images of the 80/20 split (models/digits.py) are too few
for a batch-size experiment: a global batch of 1024 would be most of an
epoch. Each training image is therefore repeated ``copies`` times, each copy
shifted by up to one pixel in each direction (zero fill), its ink scaled by
a random factor and Gaussian pixel noise added. The generator is seeded, so
every worker builds the same set. The held-out set is the real, unaugmented
test split.

Example:
    >>> x, y, x_test, y_test = augmented_digits(copies=2, seed=0)
    >>> x.shape, x_test.shape
    ((2876, 64), (359, 64))
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"
SIDE = 8  # digits are 8x8 images


def shifted(images: np.ndarray, dy: np.ndarray, dx: np.ndarray) -> np.ndarray:
    """Each [8, 8] image moved by its (dy, dx) in {-1, 0, 1}, pixels moved in from outside are 0."""
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
    rows = np.arange(SIDE)[None, :, None] + 1 - dy[:, None, None]
    cols = np.arange(SIDE)[None, None, :] + 1 - dx[:, None, None]
    return padded[np.arange(len(images))[:, None, None], rows, cols]


def augment(x: np.ndarray, copies: int, rng: np.random.Generator, noise: float = 0.08) -> np.ndarray:
    """``copies`` randomly shifted, rescaled, noisy versions of every row of ``x`` (float32 [N, 64] in [0, 1])."""
    if copies < 1:
        raise ValueError(f"copies must be >= 1, got {copies}")
    images = np.tile(x.reshape(-1, SIDE, SIDE), (copies, 1, 1))
    n = len(images)
    out = shifted(images, rng.integers(-1, 2, n), rng.integers(-1, 2, n))
    out = out * rng.uniform(0.8, 1.2, (n, 1, 1)) + rng.normal(0.0, noise, out.shape)
    return np.clip(out, 0.0, 1.0).reshape(n, SIDE * SIDE).astype(np.float32)


def augmented_digits(copies: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): ``copies`` augmented versions of the training split, shuffled; the real test split."""
    if str(MODELS_DIR) not in sys.path:
        sys.path.insert(0, str(MODELS_DIR))
    from digits import load_digits_split

    x, y, x_test, y_test = load_digits_split(test_fraction=0.2, seed=0)
    rng = np.random.default_rng(seed)
    x_aug = augment(x, copies, rng)
    y_aug = np.tile(y, copies)
    order = rng.permutation(len(y_aug))
    return x_aug[order], y_aug[order], x_test, y_test
