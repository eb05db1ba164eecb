"""Giving each worker its own, equally long part of a ``tf.data.Dataset``: ``shard``.

Example:
    >>> import tensorflow as tf
    >>> import kungfu_tf.data
    >>> [int(i) for i in kungfu_tf.data.shard(tf.data.Dataset.range(4))]  # one worker
    [0, 1, 2, 3]
"""

from __future__ import annotations

import tensorflow as tf

import kungfu_tf


class UnevenShardsError(ValueError):
    """The dataset cannot be split into equally long shards as asked."""


def shard(dataset: tf.data.Dataset, drop_remainder: bool = True) -> tf.data.Dataset:
    """This worker's shard of ``dataset``: every size-th element, all shards equally long.

    Worker r keeps elements r, r + size, r + 2·size, … of the first
    ``n - n % size`` elements, so every worker gets ``n // size`` elements and
    the last ``n % size`` elements are dropped (by every worker alike). Equal
    shards matter: with synchronous training a worker with one batch more
    than its peers waits for a collective nobody else joins, until the
    timeout. Shards are disjoint. Shard before shuffling, repeating and
    batching, so each worker's part is fixed and batches are not split. The
    cluster is read once, when this is called.

    With ``drop_remainder=False`` nothing is dropped, so ``n`` must be a
    multiple of the cluster size and known when this is called (TF's
    ``dataset.cardinality()``); otherwise :class:`UnevenShardsError` is
    raised. An infinite dataset gives infinite shards either way. A dataset
    of unknown length (after ``filter``, say) is cut into rounds of ``size``
    elements on the fly, and an incomplete last round is dropped.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.data import shard
        >>> ds = shard(tf.data.Dataset.range(10))        # rank 1 of 3: 1, 4, 7 (9 is dropped)
        >>> ds = ds.shuffle(100).batch(32)
    """
    size, rank = kungfu_tf.size(), kungfu_tf.rank()
    n = int(dataset.cardinality())
    if n == tf.data.INFINITE_CARDINALITY or size == 1:
        return dataset.shard(size, rank)
    if n == tf.data.UNKNOWN_CARDINALITY:
        if not drop_remainder:
            raise UnevenShardsError(
                f"shard(drop_remainder=False) needs a dataset of known length, to check it is a multiple "
                f"of the cluster size {size}; this one's length is unknown (after filter(), say): "
                "use drop_remainder=True, or give it a known length (e.g. apply_transformation "
                "tf.data.experimental.assert_cardinality)"
            )
        return _shard_rounds(dataset, size, rank)
    if n % size and not drop_remainder:
        raise UnevenShardsError(
            f"shard(drop_remainder=False): the dataset's {n} elements do not split evenly over "
            f"{size} workers ({n % size} left over); workers with one batch more would wait for "
            "their peers until the timeout. Use drop_remainder=True to drop the last "
            f"{n % size}, or make the length a multiple of {size}"
        )
    return dataset.take(n - n % size).shard(size, rank)


def _shard_rounds(dataset: tf.data.Dataset, size: int, rank: int) -> tf.data.Dataset:
    # window() keeps any element structure (nested, ragged, strings), unlike
    # batch(), and drop_remainder drops an incomplete last round on every worker.
    rounds = dataset.window(size, shift=size, drop_remainder=True)

    def mine(*window):
        parts = window[0] if len(window) == 1 else window
        return tf.data.Dataset.zip(parts).skip(rank).take(1)

    return rounds.flat_map(mine)
