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
    averaged, _ = average_gradients_with_rider(grads, None, fusion_threshold_bytes, sparse_as_dense, name)
    return averaged


def _rider_dtype(tensors: Sequence[tf.Tensor]) -> tf.DType:
    """The dtype a rider takes to share its host's collective: float32 or float64 if a member has it."""
    dtypes = {t.dtype for t in tensors}
    if tf.float32 in dtypes or tf.float64 not in dtypes:
        # float16 / bfloat16 would round a squared norm to 3 digits (or
        # overflow): then the rider is float32 and travels as the group's
        # float32 collective, concurrently with the gradients.
        return tf.float32
    return tf.float64


def average_gradients_with_rider(
    grads: Sequence[Gradient],
    rider: tf.Tensor | None,
    fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD_BYTES,
    sparse_as_dense: bool = False,
    name: str = "kungfu_sync_sgd",
) -> tuple[list[Gradient], tf.Tensor | None]:
    """:func:`average_gradients`, plus the mean over workers of a small 1-D ``rider`` in the same collectives.

    The rider (e.g. monitoring scalars: a local squared gradient norm, compute
    times) is appended to the smallest fused bucket, in that bucket's
    floating dtype, so it costs no collective of its own and no copy of a
    large gradient. Only if there is no dense gradient does it travel alone.

    Returns:
        ``(averaged gradients, rider averaged over workers)``, the rider
        float64 or, where it travelled as float32, float32; the second is
        None if ``rider`` is None.

    Example:
        >>> import tensorflow as tf
        >>> avg, r = average_gradients_with_rider([tf.ones([2])], tf.constant([3.0, 4.0], tf.float64), name="doc_r")
        >>> r.numpy().tolist()  # one worker: unchanged
        [3.0, 4.0]
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
        buckets = [[item] for item in dense]
        names = [f"{prefix}/grad{i}" for i, _ in dense]
    else:
        buckets = _buckets(dense, fusion_threshold_bytes)
        names = [f"{prefix}/bucket{b}" for b in range(len(buckets))]
    host = _smallest(buckets) if rider is not None else None
    reduced_rider = None
    if rider is not None and host is None:
        reduced_rider = ops.all_reduce(tf.cast(rider, tf.float64), op="mean", name=f"{prefix}/rider")
    for b, bucket in enumerate(buckets):
        tensors = [g for _, g in bucket]
        if b == host:
            *averaged, reduced = ops.group_all_reduce(
                tensors + [tf.cast(rider, _rider_dtype(tensors))], op="mean", name=names[b]
            )
            reduced_rider = reduced  # in its wire dtype: the monitor reads float32 as a Cast would
        elif len(bucket) == 1:
            # Nothing to fuse: the plain all-reduce works in place, with no
            # copy into and out of a fused buffer (64 MiB each way for the
            # comm-heavy MLP's largest kernel).
            averaged = [ops.all_reduce(tensors[0], op="mean", name=names[b])]
        else:
            averaged = ops.group_all_reduce(tensors, op="mean", name=names[b])
        for (i, _), g in zip(bucket, averaged):
            out[i] = g
    if reduced_rider is None:
        return all_or_nothing(out), None
    *out, reduced_rider = all_or_nothing([*out, reduced_rider])  # monitor state: all or nothing too
    return out, reduced_rider


def all_or_nothing(grads: Sequence[Gradient]) -> list[Gradient]:
    """``grads`` passed through one barrier: none is available before all are.

    Each bucket's collective completes on its own; without this, a graph
    could apply the variables of a finished bucket while another bucket's
    collective is still running, and if that one fails (a peer crashed) the
    worker would keep a partial update. Behind the barrier every apply
    waits for every average, so a step applies all of its update or none of
    it, on every worker alike (elastic training relies on it). Eagerly the
    collectives have already completed, so it only costs a no-op.

    Example:
        >>> import tensorflow as tf
        >>> a, b = all_or_nothing([tf.ones([2]), None])
        >>> a.numpy(), b
        (array([1., 1.], dtype=float32), None)
    """
    tensors: list[tf.Tensor] = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            tensors += [g.values, g.indices] + ([g.dense_shape] if g.dense_shape is not None else [])
        elif g is not None:
            tensors.append(g)
    if not tensors or tf.executing_eagerly():
        return list(grads)
    # Not a bare tf.identity_n: Grappler's dependency optimizer bypasses an
    # IdentityN (each consumer then reads its own input directly), and drops
    # control dependencies that a data edge already implies. One Identity per
    # tensor, each with a control dependency on a NoOp that waits for every
    # tensor, survives: whatever Grappler removes (the Identity, or the NoOp
    # when it has few edges), it moves that node's control inputs on to its
    # consumers, and only the edge that duplicates a data edge is dropped, so
    # every apply still waits for every average.
    all_ready = tf.group(*tensors, name="all_gradients_averaged")
    with tf.control_dependencies([all_ready]):
        passed = iter([tf.identity(t) for t in tensors])
    out: list[Gradient] = []
    for g in grads:
        if isinstance(g, tf.IndexedSlices):
            values, indices = next(passed), next(passed)
            shape = next(passed) if g.dense_shape is not None else None
            out.append(tf.IndexedSlices(values, indices, shape))
        else:
            out.append(None if g is None else next(passed))
    return out


def _smallest(buckets: list[list[tuple[int, tf.Tensor]]]) -> int | None:
    """Index of the bucket with the fewest known bytes (the first on ties; None if there is none).

    A pure function of the gradient list, so every worker picks the same one.
    """
    best, best_bytes = None, None
    for b, bucket in enumerate(buckets):
        sizes = [_static_nbytes(g) for _, g in bucket]
        nbytes = sum(sizes) if None not in sizes else float("inf")
        if best_bytes is None or nbytes < best_bytes:
            best, best_bytes = b, nbytes
    return best
