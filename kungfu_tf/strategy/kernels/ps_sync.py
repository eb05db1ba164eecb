"""Synchronous parameter-server kernel: gradients to the owner, new values from it.

Dense: the owner receives the mean of every worker's gradient (``reduce`` to
the owner: the other ranks get nothing back), applies the wrapped optimizer,
and ``broadcast`` sends the new value to everyone.

Sparse: the slices of every worker are gathered (bytes scale with the touched
rows), the owner applies them, and then sends only the rows its update
*changed*, found by comparing the table before and after the update. That is
exact for every optimizer: plain SGD changes only the touched rows, while an
optimizer with momentum may change every row and then sends them all.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.strategy.kernels.ps_sync import reduce_to_owner
    >>> reduce_to_owner(tf.ones([2]), owner=0, name="doc").numpy()  # one worker
    array([1., 1.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from kungfu_tf import ops


def reduce_to_owner(g: tf.Tensor, owner: int, name: str) -> tf.Tensor:
    """The mean gradient over all workers on ``owner``; other ranks get their own ``g`` back (unused)."""
    return ops.reduce(g, root=owner, op="mean", name=name)


def publish_value(value: tf.Tensor, owner: int, name: str) -> tf.Tensor:
    """``owner``'s ``value`` on every rank (the others pass any tensor of the same shape)."""
    return ops.broadcast(value, root=owner, name=name)


def publish_together(values: Sequence[tf.Tensor], owner: int, name: str) -> list[tf.Tensor]:
    """``owner``'s ``values`` (static shapes) on every rank, in one broadcast per dtype.

    A parameter server's new value and its optimizer slots' replicas travel
    together: one message instead of one per tensor, and a broadcast that a
    lost owner fails leaves all of them as they were or none. Slots of
    another dtype than the value (Adafactor's int32 placeholders of a bias)
    go in a broadcast of their own, after it: a caller that uses only some
    outputs must keep the others alive (``ops.keep_alive``).

    Example:
        >>> value, slot = publish_together([tf.ones([2]), tf.zeros([1, 3])], owner=0, name="doc")  # one worker
        >>> value.numpy(), slot.shape
        (array([1., 1.], dtype=float32), TensorShape([1, 3]))
    """
    groups: dict[tf.DType, list[int]] = {}
    for i, v in enumerate(values):
        groups.setdefault(v.dtype, []).append(i)
    out: list[tf.Tensor] = list(values)
    for n, indices in enumerate(groups.values()):  # the first value's dtype first, the same order on every rank
        sizes = [values[i].shape.num_elements() for i in indices]
        packed = tf.concat([tf.reshape(values[i], [-1]) for i in indices], 0)
        got = publish_value(packed, owner, name if n == 0 else f"{name}/{values[indices[0]].dtype.name}")
        for i, part in zip(indices, tf.split(got, sizes)):
            out[i] = tf.reshape(part, values[i].shape)
    return out


def changed_rows(before: tf.Tensor, after: tf.Tensor) -> tf.Tensor:
    """Indices (int32) of the rows of ``after`` that differ from ``before``.

    Example:
        >>> changed_rows(tf.zeros([3, 2]), tf.constant([[0., 0.], [1., 0.], [0., 0.]])).numpy()
        array([1], dtype=int32)
    """
    differs = tf.not_equal(before, after)
    if before.shape.rank > 1:
        differs = tf.reduce_any(differs, axis=list(range(1, before.shape.rank)))
    return tf.cast(tf.reshape(tf.where(differs), [-1]), tf.int32)


def publish_rows(
    is_owner: bool, before: tf.Tensor | None, table: tf.Variable, owner: int, name: str
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(row indices, row values, count) the owner's update changed, on every rank.

    Three broadcasts: the count (so the others can size their buffers), the
    indices, the rows. ``before`` is the owner's table before its update
    (None on the other ranks).
    """
    row_shape = table.shape[1:]
    if is_owner:
        after = tf.convert_to_tensor(table)
        rows = changed_rows(before, after)
        count = tf.shape(rows)[0]
        values = tf.gather(after, rows)
    else:
        count = tf.constant(0, tf.int32)
    count = publish_value(count, owner, f"{name}/count")
    if not is_owner:
        rows = tf.zeros([count], tf.int32)
        values = tf.zeros(tf.concat([[count], row_shape], axis=0), table.dtype)
    rows = publish_value(rows, owner, f"{name}/rows")
    values = publish_value(values, owner, f"{name}/values")
    return rows, values, count
