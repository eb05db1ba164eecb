"""Point-to-point operations between workers, addressed by rank.

* Model store: a worker saves named, versioned tensors; peers request them.
* Accumulators (asynchronous parameter servers): peers push tensors into a
  named sum on one worker, which takes the sum and the number of pushes.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.ops import p2p
    >>> p2p.save("w", tf.ones([2]))
    >>> p2p.request(0, "w", like=tf.zeros([2])).numpy()
    array([1., 1.], dtype=float32)
    >>> p2p.push(0, "g", tf.ones([2]))
    >>> total, count = p2p.take("g", like=tf.zeros([2]))
    >>> total.numpy(), int(count)
    (array([1., 1.], dtype=float32), 1)
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf._native import library
from kungfu_tf.ops._keys import check_name


def _name(name: str | tf.Tensor) -> str | tf.Tensor:
    # A tensor is checked by the kernel when it runs.
    return check_name(name) if isinstance(name, str) else name


def _version(version: int | tf.Tensor | None) -> tf.Tensor:
    return tf.constant(-1, tf.int64) if version is None else tf.cast(version, tf.int64)


def save(name: str, x: tf.Tensor, version: int | tf.Tensor | None = None) -> tf.Operation | None:
    """Keeps a copy of ``x`` under ``name`` (and ``version``; None: just the latest)."""
    return library().kungfu_save(_name(name), tf.convert_to_tensor(x), _version(version))


def forget(prefix: str) -> None:
    """Drops what this worker holds under ``prefix + "/"``: every version of the blobs :func:`save` kept, the
    accumulators :func:`push` added into, the tables :func:`save_rows` published (eager).

    For names no step will use again (a replaced strategy plan's). A request
    parked for a forgotten name stays parked; a later push or save starts it
    again from empty.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.ops import p2p
        >>> p2p.save("doc_forget/x", tf.constant([1.0]), version=1)
        >>> p2p.forget("doc_forget")  # a request for "doc_forget/x" now raises NotFoundError
    """
    library().kungfu_state_forget(check_name(prefix))


def request(rank: int | tf.Tensor, name: str, like: tf.Tensor, version: int | tf.Tensor | None = None) -> tf.Tensor:
    """Fetches what worker ``rank`` saved under ``name``; ``like`` gives shape and dtype.

    Raises NotFoundError if nothing was saved there, InvalidArgumentError if the
    saved tensor has a different size.
    """
    return library().kungfu_request(tf.cast(rank, tf.int32), _name(name), _version(version), tf.convert_to_tensor(like))


def request_at_least(
    rank: int | tf.Tensor, name: str | tf.Tensor, min_version: int | tf.Tensor, like: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """(tensor, version): the newest version >= ``min_version`` that worker ``rank`` saved under ``name``.

    If worker ``rank`` holds no such version yet, the request waits there
    (no polling) and is answered by the :func:`save` that brings one. After
    the runtime timeout (``kungfu-run --timeout``) it raises
    DeadlineExceededError naming the worker, ``name`` and ``min_version``; a
    dead worker raises UnavailableError. ``version`` (int64) is the version
    received (-1 for a save without a version, which counts as the newest);
    ``like`` gives shape and dtype, and a saved tensor of another size raises
    InvalidArgumentError. For stale-synchronous training: a worker at clock c
    with staleness s waits for its peers' clock c - s.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.ops import p2p
        >>> p2p.save("clock", tf.constant(4, tf.int64), version=4)
        >>> value, version = p2p.request_at_least(0, "clock", 3, like=tf.constant(0, tf.int64))
        >>> int(value), int(version)
        (4, 4)
    """
    if isinstance(min_version, int) and min_version < 0:
        raise ValueError(f"min_version must be >= 0, got {min_version}")
    out, version = library().kungfu_request_at_least(
        tf.cast(rank, tf.int32), _name(name), tf.cast(min_version, tf.int64), tf.convert_to_tensor(like)
    )
    return out, version


def push(rank: int | tf.Tensor, name: str | tf.Tensor, x: tf.Tensor) -> tf.Operation | None:
    """Adds ``x`` element-wise into worker ``rank``'s accumulator ``name``.

    The accumulator is created by the first push (or take) of ``name`` on that
    worker, which fixes its dtype (float16, bfloat16, float32, float64, int32,
    int64) and element count. Completes once the bytes are written to the
    connection (or added, when ``rank`` is this worker); it does not wait for
    the receiver. A push that does not match the accumulator is dropped there
    and the receiver's next :func:`take` raises InvalidArgumentError naming
    this worker. A dead peer raises UnavailableError, a silent one
    DeadlineExceededError after the runtime timeout.

    Pushes from one worker to one peer arrive in order, and before anything
    that worker sends the peer later (a barrier, say): after
    ``push(...); barrier()`` the receiver's take sees the push.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.ops import p2p
        >>> p2p.push(0, "grad/w", tf.constant([1.0, 2.0]))  # to worker 0 (here: ourselves)
    """
    return library().kungfu_push(tf.cast(rank, tf.int32), _name(name), tf.convert_to_tensor(x))


def take(name: str | tf.Tensor, like: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(sum, count): everything pushed into this worker's accumulator ``name`` since the last take.

    ``sum`` has ``like``'s shape and dtype; ``count`` (int64) is the number of
    pushes it holds. The accumulator starts again from empty. Never waits:
    with nothing pushed it returns zeros and 0. Raises InvalidArgumentError,
    keeping the sum for the next take, if a push was dropped for not matching
    the accumulator (naming its sender and both sizes) or if ``like`` does not
    match it.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.ops import p2p
        >>> total, count = p2p.take("nothing/yet", like=tf.zeros([3], tf.int64))
        >>> total.numpy(), int(count)
        (array([0, 0, 0]), 0)
    """
    total, count = library().kungfu_take(_name(name), tf.convert_to_tensor(like))
    return total, count


# ------------------------------------------------------------ tables by rows
# Parameter servers with sparse gradients: only touched or changed rows travel.


def push_rows(rank: int | tf.Tensor, name: str | tf.Tensor, slices: tf.IndexedSlices, num_rows: int) -> tf.Operation | None:
    """Adds the rows of ``slices`` into worker ``rank``'s table accumulator ``name``.

    The table has ``num_rows`` rows shaped like ``slices.values[0]``; row
    ``slices.indices[i]`` gets ``slices.values[i]`` added (a repeated index
    adds twice). Only these rows travel. Ordering, completion and errors as
    :func:`push`; a row index outside the table drops the whole push there
    and the receiver's :func:`take_rows` names this worker and the row.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.ops import p2p
        >>> g = tf.IndexedSlices(tf.ones([2, 3]), tf.constant([4, 1]), tf.constant([10, 3]))
        >>> p2p.push_rows(0, "emb/grad", g, num_rows=10)
        >>> rows, values, count = p2p.take_rows("emb/grad", shape=[10, 3], dtype=tf.float32)
        >>> rows.numpy().tolist(), values.shape.as_list(), int(count)
        ([1, 4], [2, 3], 1)
    """
    return library().kungfu_push_rows(
        tf.cast(rank, tf.int32), _name(name), slices.indices, slices.values, tf.constant(num_rows, tf.int64)
    )


def take_rows(
    name: str | tf.Tensor, shape: list[int] | tf.TensorShape, dtype: tf.DType
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(rows, sums, count): the rows pushed into table accumulator ``name`` since the last take.

    ``rows`` (int64, ascending) index a table of ``shape``; ``sums`` holds
    their sums (``[len(rows)] + shape[1:]``); ``count`` is the number of
    pushes. The rows start again from zero. Never waits. Errors as
    :func:`take`.
    """
    return library().kungfu_take_rows(_name(name), T=dtype, shape=tf.TensorShape(shape))


def save_rows(
    name: str | tf.Tensor, table: tf.Tensor, rows: tf.Tensor, version: int | tf.Tensor
) -> tf.Operation | None:
    """Publishes ``table`` as ``version`` (> 0) of table ``name``, changed in ``rows`` only.

    Peers fetch it with :func:`request_rows`. The first save of a name keeps
    the whole table; later ones copy only ``rows`` (the rows that differ from
    the previous version). Raises InvalidArgumentError if the table's shape
    changed or a row is outside it.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.ops import p2p
        >>> p2p.save_rows("doc/table", tf.zeros([4, 2]), rows=tf.zeros([0], tf.int32), version=1)
        >>> rows, values, version = p2p.request_rows(0, "doc/table", 1, shape=[4, 2], dtype=tf.float32)
        >>> rows.numpy().tolist(), int(version)  # the first fetch: every row
        ([0, 1, 2, 3], 1)
    """
    return library().kungfu_save_rows(_name(name), table, rows, tf.cast(version, tf.int64))


def request_rows(
    rank: int | tf.Tensor,
    name: str | tf.Tensor,
    min_version: int | tf.Tensor,
    shape: list[int] | tf.TensorShape,
    dtype: tf.DType,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(rows, values, version): what this worker needs of worker ``rank``'s table ``name``.

    Waits (on that worker, no polling) until it has saved a version >=
    ``min_version``, then returns the rows that changed since the version
    this worker last received from it, as of the newest version, and that
    version. The first request (or one after a lost answer) returns every
    row. Scattering ``values`` into ``rows`` of the copy from the previous
    request gives the owner's table. Timeout and dead workers as
    :func:`request_at_least`; a table of another shape raises
    InvalidArgumentError.
    """
    if isinstance(min_version, int) and min_version < 0:
        raise ValueError(f"min_version must be >= 0, got {min_version}")
    return library().kungfu_request_rows(
        tf.cast(rank, tf.int32), _name(name), tf.cast(min_version, tf.int64), T=dtype, shape=tf.TensorShape(shape)
    )
