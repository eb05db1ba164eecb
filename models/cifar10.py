"""CIFAR-10 in the official binary format, plus same-shaped synthetic data.

The binary version (cifar-10-binary.tar.gz: data_batch_1.bin ..
data_batch_5.bin, test_batch.bin) stores 10000 records per file, each record
being 1 label byte (0-9) followed by 3072 pixel bytes: the 1024 red values,
then green, then blue, each 32x32 in row-major order (CHW). Nothing is
downloaded here: point the loader at files that are already on disk.

Example:
    >>> x, y = synthetic_cifar10(n=4, seed=0)
    >>> x.shape, x.dtype, y.shape, y.dtype
    ((4, 32, 32, 3), dtype('float32'), (4,), dtype('int32'))
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HEIGHT = WIDTH = 32
CHANNELS = 3
NUM_CLASSES = 10
RECORD_BYTES = 1 + CHANNELS * HEIGHT * WIDTH  # 3073
TRAIN_FILES = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
TEST_FILES = ("test_batch.bin",)


def cifar10_files(data_dir: str | os.PathLike[str], train: bool = True) -> list[Path]:
    """Paths of the official train (5 files) or test (1 file) batches in ``data_dir``.

    Example:
        >>> [p.name for p in cifar10_files("cifar-10-batches-bin", train=False)]
        ['test_batch.bin']
    """
    return [Path(data_dir) / name for name in (TRAIN_FILES if train else TEST_FILES)]


def _read_records(path: Path) -> np.ndarray:
    raw = np.fromfile(path, dtype=np.uint8)
    # The official files hold exactly 10000 records, but any whole number is
    # accepted so that subsets (and test fixtures) load too; a partial record
    # means a truncated or wrong file, which must not be silently misaligned.
    if raw.size == 0 or raw.size % RECORD_BYTES:
        raise ValueError(
            f"{path}: {raw.size} bytes is not a positive multiple of the CIFAR-10 record size "
            f"{RECORD_BYTES} (1 label byte + 3072 pixel bytes); truncated or not a CIFAR-10 binary batch?"
        )
    records = raw.reshape(-1, RECORD_BYTES)
    if records[:, 0].max() >= NUM_CLASSES:
        raise ValueError(f"{path}: label byte {records[:, 0].max()} is out of range 0-9; not a CIFAR-10 binary batch?")
    return records


def load_cifar10_batches(paths: Sequence[str | os.PathLike[str]]) -> tuple[np.ndarray, np.ndarray]:
    """Reads binary batch files into (x float32 [N, 32, 32, 3] in [0, 1], y int32 [N]).

    Records keep file order, then in-file order. Raises ValueError naming the
    file if its length is not a whole number of 3073-byte records.

    Example:
        >>> x, y = load_cifar10_batches(cifar10_files("cifar-10-batches-bin"))  # doctest: +SKIP
        >>> x.shape, y.shape  # doctest: +SKIP
        ((50000, 32, 32, 3), (50000,))
    """
    if not paths:
        raise ValueError("no CIFAR-10 batch files given")
    records = np.concatenate([_read_records(Path(p)) for p in paths])
    labels = records[:, 0].astype(np.int32)
    # CHW on disk -> HWC, the layout Keras convolutions expect by default.
    pixels = records[:, 1:].reshape(-1, CHANNELS, HEIGHT, WIDTH).transpose(0, 2, 3, 1)
    return (pixels.astype(np.float32) / 255.0), labels


def synthetic_cifar10(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Learnable CIFAR-10-shaped data: x float32 [n, 32, 32, 3] in [0, 1], y int32 [n].

    Each class has a fixed random low-resolution colour pattern; an image is
    its class pattern plus noise, so a convolutional network can learn it.

    Example:
        >>> x, y = synthetic_cifar10(n=10, seed=1)
        >>> 0.0 <= float(x.min()) and float(x.max()) <= 1.0 and int(y.max()) < 10
        True
    """
    rng = np.random.default_rng(seed)
    # 4x4 patterns upsampled to 32x32: coarse structure, not per-pixel noise.
    patterns = rng.uniform(0.2, 0.8, size=(NUM_CLASSES, 4, 4, CHANNELS)).astype(np.float32)
    patterns = patterns.repeat(HEIGHT // 4, axis=1).repeat(WIDTH // 4, axis=2)
    y = rng.integers(0, NUM_CLASSES, size=n).astype(np.int32)
    noise = rng.normal(0.0, 0.15, size=(n, HEIGHT, WIDTH, CHANNELS)).astype(np.float32)
    return np.clip(patterns[y] + noise, 0.0, 1.0), y
