"""Averaging a list of gradients over all workers: the part every S-SGD wrapper shares.

Dense gradients are fused into buckets of at most ``fusion_threshold_bytes``
and each bucket is averaged with one ``group_all_reduce``; ``tf.IndexedSlices``
are all-gathered (indices and values of every worker, concatenated) unless
``sparse_as_dense`` is set; ``None`` stays ``None``.

Every collective gets an explicit name derived from the gradient's *position*
in the list, never from trace or creation order, so the message keys agree on
every worker however each one traced its program.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers.gradient_sync import average_gradients
    >>> g = average_gradients([tf.ones([2]), None])  # one worker: unchanged
    >>> g[0].numpy(), g[1]
    (array([1., 1.], dtype=float32), None)
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from kungfu_tf import ops

# In the ops layer because the strategy compiler (below the optimizers) shares them.
from kungfu_tf.ops.call_names import call_prefix
from kungfu_tf.ops.indexed_slices import average_indexed_slices

DEFAULT_FUSION_THRESHOLD_BYTES = 64 * 1024 * 1024

Gradient = tf.Tensor | tf.IndexedSlices | None

def _static_nbytes(t: tf.Tensor) -> int | None:
    """Size in bytes if the shape is fully known, else None."""
    n = t.shape.num_elements()
    return None if n is None else n * t.dtype.size


def _buckets(dense: list[tuple[int, tf.Tensor]], threshold: int) -> list[list[tuple[int, tf.Tensor]]]:
    """Consecutive gradients grouped so that each group holds at most ``threshold`` bytes.

    A gradient larger than the threshold, or of unknown size, is a bucket on
    its own. Grouping consecutive gradients keeps the buckets a pure function
    of the list, hence equal on every worker.
    """
    out: list[list[tuple[int, tf.Tensor]]] = []
    current: list[tuple[int, tf.Tensor]] = []
    current_bytes = 0
    for item in dense:
        nbytes = _static_nbytes(item[1])
        if nbytes is None or nbytes > threshold or current_bytes + nbytes > threshold:
            if current:
                out.append(current)
            current, current_bytes = [], 0
            if nbytes is None or nbytes > threshold:
                out.append([item])
                continue
        current.append(item)
        current_bytes += nbytes
    if current:
        out.append(current)
    return out


def average_gradients(
    grads: Sequence[Gradient],
    fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD_BYTES,
    sparse_as_dense: bool = False,
    name: str = "kungfu_sync_sgd",
) -> list[Gradient]:
    """The average of ``grads`` over all workers, position by position.

    Args:
        grads: dense tensors, ``tf.IndexedSlices`` or ``None``; every worker
            must pass the same structure (same positions, dtypes, shapes).
        fusion_threshold_bytes: dense gradients are averaged in fused buckets
            of at most this many bytes; 0 averages each one on its own.
        sparse_as_dense: convert ``tf.IndexedSlices`` to dense tensors and
            all-reduce them instead of all-gathering the slices.
        name: prefix of the collectives' message keys. Must be unique per call
            site in a program; repeated calls in one graph are numbered.

    Returns:
        A list like ``grads``: averaged tensors, averaged ``tf.IndexedSlices``
        (the slices of all workers concatenated, values divided by the number
        of workers), and ``None`` where ``grads`` had ``None``.

    Example:
        >>> import tensorflow as tf
        >>> grads = [tf.ones([3]), tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([4, 2]))]
        >>> avg = average_gradients(grads, fusion_threshold_bytes=0, name="doc")
        >>> avg[0].numpy(), avg[1].indices.numpy()  # one worker: unchanged
        (array([1., 1., 1.], dtype=float32), array([0], dtype=int32))
    """
    if fusion_threshold_bytes < 0:
        raise ValueError(f"fusion_threshold_bytes must be >= 0, got {fusion_threshold_bytes}")
    prefix = call_prefix(name)
    out: list[Gradient] = list(grads)
    dense: list[tuple[int, tf.Tensor]] = []
    for i, g in enumerate(grads):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices):
            if not sparse_as_dense:
                out[i] = average_indexed_slices(g, f"{prefix}/sparse{i}")
                continue
            g = tf.convert_to_tensor(g)
        dense.append((i, tf.convert_to_tensor(g)))

    if fusion_threshold_bytes == 0:
        for i, g in dense:
            out[i] = ops.all_reduce(g, op="mean", name=f"{prefix}/grad{i}")
        return out
    for b, bucket in enumerate(_buckets(dense, fusion_threshold_bytes)):
        if len(bucket) == 1:
            # Nothing to fuse: the plain all-reduce works in place, with no
            # copy into and out of a fused buffer (64 MiB each way for the
            # comm-heavy MLP's largest kernel).
            (i, g), = bucket
            out[i] = ops.all_reduce(g, op="mean", name=f"{prefix}/bucket{b}")
            continue
        averaged = ops.group_all_reduce([g for _, g in bucket], op="mean", name=f"{prefix}/bucket{b}")
        for (i, _), g in zip(bucket, averaged):
            out[i] = g
    return out
