"""Batches whose size follows a variable: ``adaptive_batch``.

An adaptation policy changes the batch size between two steps; the traced
step must not be traced again, and the next batch must already have the new
size. A ``tf.data`` batch size is fixed when the pipeline is built, so here
the pipeline reads an int64 ``tf.Variable`` whenever it has gathered rows
enough to decide, and the batch dimension is unknown (None) in the element
spec, which keeps one concrete function for every size.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.data import adaptive_batch
    >>> size = tf.Variable(2, dtype=tf.int64)
    >>> it = iter(adaptive_batch(tf.data.Dataset.range(10), size))
    >>> next(it).numpy()
    array([0, 1])
    >>> _ = size.assign(3)
    >>> next(it).numpy()
    array([2, 3, 4])
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def adaptive_batch(dataset: tf.data.Dataset, batch_size: tf.Variable, granularity: int = 1) -> tf.data.Dataset:
    """``dataset`` in batches of ``batch_size`` rows, read when each batch is cut.

    ``batch_size`` is an int64 scalar ``tf.Variable`` (a policy runner's
    ``local_batch_size``: the per-worker batch). A value assigned between two
    steps applies from the next batch the pipeline delivers, so put nothing
    that reads ahead after this (no ``prefetch``; prefetch the elements
    before it instead). For the same reason the returned dataset disables
    ``tf.data`` autotuning and prefetch injection, which would read ahead.

    How: the elements are first batched statically into chunks of
    ``granularity`` rows (fast, in C++); a ``scan`` over the chunks appends
    each to a buffer and cuts a batch as soon as the buffer holds the
    variable's value of rows. Each chunk costs one function call (tens of
    microseconds), so a per-worker batch of ``k * granularity`` rows costs
    ``k`` calls: choose ``granularity`` as the largest number all your batch
    sizes are multiples of (``GNSBatchSizePolicy(round_to=...)`` keeps them
    so). Sizes that are not multiples still work; the rows left over start
    the next batch. An incomplete last batch at the end of the data is
    dropped, on every worker alike when the shards are equally long
    (:func:`kungfu_tf.data.shard`).

    The number of batches in a pass depends on the sizes chosen while it
    runs, so the dataset's cardinality is unknown. Keras ``fit`` then takes
    the first epoch's step count for every later epoch: after the batch
    grows, an epoch ends early with a "ran out of data" warning; after it
    shrinks, an epoch stops before the pass is over. Pass
    ``steps_per_epoch`` with a ``.repeat()``-ed dataset to count epochs in
    steps instead (see ``kungfu_tf.keras.PolicyCallback``).

    Raises:
        TypeError: ``batch_size`` is not an int64 scalar variable.
        ValueError: ``granularity`` is not a positive int.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.data import adaptive_batch, shard
        >>> from kungfu_tf.policy import PolicyRunner
        >>> runner = PolicyRunner([], batch_size=64)          # global batch
        >>> ds = adaptive_batch(shard(tf.data.Dataset.range(1000)), runner.local_batch_size, granularity=8)
    """
    if not isinstance(batch_size, tf.Variable) or batch_size.dtype != tf.int64 or batch_size.shape.rank != 0:
        raise TypeError(f"adaptive_batch: batch_size must be an int64 scalar tf.Variable, got {batch_size!r}")
    if isinstance(granularity, bool) or not isinstance(granularity, int) or granularity <= 0:
        raise ValueError(f"adaptive_batch: granularity must be a positive int, got {granularity!r}")
    chunks = dataset.batch(granularity)
    empty = tf.nest.map_structure(lambda s: tf.zeros([0, *s.shape[1:]], s.dtype), chunks.element_spec)

    @tf.autograph.experimental.do_not_convert
    def gather(buffer: Any, chunk: Any) -> tuple[Any, tuple[tf.Tensor, Any]]:
        buffer = tf.nest.map_structure(lambda b, c: tf.concat([b, c], 0), buffer, chunk)
        rows = tf.shape(tf.nest.flatten(buffer)[0], out_type=tf.int64)[0]
        # Read now, when the step asks for this batch: the last value assigned.
        wanted = tf.maximum(batch_size.read_value(), 1)
        ready = rows >= wanted
        cut = tf.where(ready, wanted, tf.constant(0, tf.int64))
        batch = tf.nest.map_structure(lambda b: b[:cut], buffer)
        rest = tf.nest.map_structure(lambda b: b[cut:], buffer)
        return rest, (ready, batch)

    @tf.autograph.experimental.do_not_convert
    def is_ready(ready: tf.Tensor, batch: Any) -> tf.Tensor:
        return ready

    @tf.autograph.experimental.do_not_convert
    def batch_only(ready: tf.Tensor, batch: Any) -> Any:
        return batch

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return chunks.scan(empty, gather).filter(is_ready).map(batch_only).with_options(options)
