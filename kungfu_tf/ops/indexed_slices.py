"""Averaging ``tf.IndexedSlices`` over all workers by all-gathering the touched rows.

Shared by the optimizers' gradient averaging and the strategy compiler's
sparse all-reduce path.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.ops.indexed_slices import average_indexed_slices
    >>> g = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([3]), tf.constant([5, 2]))
    >>> average_indexed_slices(g, "doc_sparse").indices.numpy()  # one worker: unchanged
    array([3], dtype=int32)
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf.ops.collective import all_gather
from kungfu_tf.ops.config import cluster_size


def average_indexed_slices(g: tf.IndexedSlices, name: str) -> tf.IndexedSlices:
    """Every worker's (indices, values) concatenated in rank order, values divided by size.

    Only the touched rows travel: the bytes sent scale with the number of
    slices, not with the size of the variable.

    Workers may hold different numbers of slices (e.g. different batch
    shapes), but all_gather needs equal shapes: gather the counts first, pad to
    the largest, gather, then drop the padding.
    """
    indices, values = g.indices, g.values
    count = tf.shape(indices, out_type=tf.int32)[0]
    counts = all_gather(count, name=f"{name}/count")
    longest = tf.reduce_max(counts)
    pad = longest - count
    indices = tf.pad(indices, [[0, pad]])
    value_pads = tf.concat([[[0, pad]], tf.zeros([tf.rank(values) - 1, 2], tf.int32)], axis=0)
    values = tf.pad(values, value_pads)
    all_indices = all_gather(indices, name=f"{name}/indices")  # [np, longest]
    all_values = all_gather(values, name=f"{name}/values")  # [np, longest, ...]
    keep = tf.sequence_mask(counts, longest)
    size = tf.cast(cluster_size(), g.values.dtype)
    return tf.IndexedSlices(
        values=tf.boolean_mask(all_values, keep) / size,
        indices=tf.boolean_mask(all_indices, keep),
        dense_shape=g.dense_shape,
    )
