"""Giving each worker its own part of a ``tf.data.Dataset``: ``shard``.

Example:
    >>> import tensorflow as tf
    >>> import kungfu_tf.data
    >>> [int(i) for i in kungfu_tf.data.shard(tf.data.Dataset.range(4))]  # one worker
    [0, 1, 2, 3]
"""

from __future__ import annotations

import tensorflow as tf

import kungfu_tf


def shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``dataset.shard(size, rank)`` for the current cluster: every size-th element.

    Worker r keeps elements r, r + size, r + 2·size, …: the shards are
    disjoint and together hold the whole dataset. Shard before shuffling,
    repeating and batching, so each worker's part is fixed and batches are
    not split. The cluster is read once, when this is called.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.data import shard
        >>> ds = shard(tf.data.Dataset.range(10))        # rank 1 of 3: 1, 4, 7
        >>> ds = ds.shuffle(100).batch(32)
    """
    return dataset.shard(kungfu_tf.size(), kungfu_tf.rank())
