"""``kungfu_tf.data.shard`` gives every worker an equally long shard.

The cluster (size, rank) is set by replacing ``kungfu_tf.size``/``rank`` in
this process, so every rank of np = 1..4 is checked against numpy
without starting jobs.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import kungfu_tf
import kungfu_tf.data
from kungfu_tf.data import UnevenShardsError


def as_worker(monkeypatch, rank: int, size: int) -> None:
    monkeypatch.setattr(kungfu_tf, "size", lambda: size)
    monkeypatch.setattr(kungfu_tf, "rank", lambda: rank)


def expected(n: int, rank: int, size: int) -> np.ndarray:
    """numpy: rank r's elements of range(n) once the last n % size are dropped."""
    return np.arange(n)[: n - n % size][rank::size]


def elements(ds: tf.data.Dataset) -> np.ndarray:
    return np.array(list(ds.as_numpy_iterator()), np.int64)


def known_length(n):
    return tf.data.Dataset.range(n)


def unknown_length(n):
    return tf.data.Dataset.range(n + 5).filter(lambda x: x < n)


@pytest.mark.parametrize("make", [known_length, unknown_length], ids=["known", "unknown"])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [0, 1, 7, 12, 101])
def test_shards_are_even_disjoint_and_match_numpy(monkeypatch, make, size, n):
    shards = []
    for rank in range(size):
        as_worker(monkeypatch, rank, size)
        got = elements(kungfu_tf.data.shard(make(n)))
        np.testing.assert_array_equal(got, expected(n, rank, size), err_msg=f"rank {rank} of {size}, n={n}")
        shards.append(got)
    assert {len(s) for s in shards} == {n // size}
    union = np.sort(np.concatenate(shards)) if shards else np.array([])
    np.testing.assert_array_equal(union, np.arange(n - n % size))


def test_nested_ragged_elements_of_unknown_length(monkeypatch):
    words = [b"a", b"bb", b"ccc", b"d", b"ee", b"fff", b"g"]
    ds = tf.data.Dataset.from_tensor_slices((tf.ragged.constant([[1] * len(w) for w in words]), words))
    ds = ds.filter(lambda r, w: True)  # unknown length
    for rank in range(3):
        as_worker(monkeypatch, rank, 3)
        got = [w for _, w in kungfu_tf.data.shard(ds).as_numpy_iterator()]
        assert got == words[:6][rank::3]


def test_infinite_dataset_keeps_every_size_th(monkeypatch):
    as_worker(monkeypatch, 2, 3)
    got = elements(kungfu_tf.data.shard(tf.data.Dataset.range(5).repeat()).take(6))
    np.testing.assert_array_equal(got, np.array([2, 0, 3, 1, 4, 2]))


def test_keeping_the_remainder_raises_clearly(monkeypatch):
    as_worker(monkeypatch, 0, 3)
    np.testing.assert_array_equal(elements(kungfu_tf.data.shard(known_length(9), drop_remainder=False)), [0, 3, 6])
    with pytest.raises(UnevenShardsError, match="10 elements do not split evenly over 3 workers \\(1 left over\\)"):
        kungfu_tf.data.shard(known_length(10), drop_remainder=False)
    with pytest.raises(UnevenShardsError, match="length is unknown"):
        kungfu_tf.data.shard(unknown_length(9), drop_remainder=False)
