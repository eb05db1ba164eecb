"""The state of ``tf.compat.v1`` graph variables (``SessionVariable``), moved as bytes through Python.

Graph variables live in a session's resources, out of reach of the eager
``kungfu_tf.ops.state_sync`` ops that move every other variable in C++; a
``SessionVariable`` reads and assigns its value through its session. Their
bytes are concatenated in order, cut into one contiguous slice per source
(slice ``j`` travels from source ``j``) and hashed with the same layout as
:func:`kungfu_tf.ops.state_sync.state_digest` (by the same C++ code, over
every 4 MiB piece), so the digest does not depend on which path moved them.

Example:
    >>> from kungfu_tf.elastic.session_state_transfer import slice_bounds
    >>> slice_bounds(10, 3)
    [(0, 3), (3, 6), (6, 10)]
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from kungfu_tf.elastic.signature import variable_dtype, variable_name
from kungfu_tf.ops import p2p, state_sync


def variable_bytes(variables: Sequence[object]) -> bytes:
    """The values of ``variables`` concatenated as raw bytes, in order."""
    return b"".join(np.ascontiguousarray(np.asarray(v.numpy())).tobytes() for v in variables)  # type: ignore[attr-defined]


def byte_count(variables: Sequence[object]) -> int:
    """How many bytes :func:`variable_bytes` gives for ``variables`` (from their shapes, reading nothing)."""
    return sum(variable_dtype(v).size * int(np.prod(tf.TensorShape(v.shape).as_list(), dtype=np.int64)) for v in variables)  # type: ignore[attr-defined]


def assign_from_bytes(variables: Sequence[object], data: bytes | np.ndarray) -> None:
    """Assigns each variable its part of ``data`` (as laid out by :func:`variable_bytes`).

    Raises:
        ValueError: ``data`` has another length than the variables need.
    """
    buf = memoryview(np.ascontiguousarray(np.frombuffer(data, np.uint8)))
    sizes = [variable_dtype(v).size * int(np.prod(tf.TensorShape(v.shape).as_list(), dtype=np.int64)) for v in variables]  # type: ignore[attr-defined]
    if sum(sizes) != len(buf):
        raise ValueError(f"elastic state: received {len(buf)} bytes of variables, this model has {sum(sizes)}")
    offset = 0
    for v, n in zip(variables, sizes):
        dtype = variable_dtype(v).as_numpy_dtype
        value = np.frombuffer(buf[offset : offset + n], dtype=dtype).reshape(tf.TensorShape(v.shape).as_list())  # type: ignore[attr-defined]
        try:
            v.assign(value)  # type: ignore[attr-defined]
        except Exception as e:
            raise ValueError(f"elastic state: cannot assign variable {variable_name(v)!r}: {e}") from e
        offset += n


def slice_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous [start, end) ranges that cover ``total`` bytes, sizes differing by at most 1."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    return [(total * j // parts, total * (j + 1) // parts) for j in range(parts)]


def bytes_digest(data: bytes) -> bytes:
    """The digest state_sync gives the same bytes (computed by its C++ op)."""
    return state_sync.bytes_digest(data)


@functools.cache
def _fetcher(count: int):
    """A tf.function that issues ``count`` p2p requests at once (the kernels are asynchronous)."""

    @tf.function(
        input_signature=[
            tf.TensorSpec([count], tf.int32),
            tf.TensorSpec([count], tf.string),
            tf.TensorSpec([count], tf.int64),
            tf.TensorSpec([], tf.int64),
        ],
        autograph=False,
    )
    def fetch(ranks, names, lengths, version):
        out = []
        for j in range(count):
            like = tf.zeros(tf.reshape(lengths[j], [1]), tf.uint8)
            value, _ = p2p.request_at_least(ranks[j], names[j], version, like)
            out.append(value)
        return out

    return fetch


def fetch_blobs(requests: Sequence[tuple[int, str, int]], version: int) -> list[bytes]:
    """Fetches (rank, name, length) blobs saved with a version >= ``version``, all in parallel."""
    if not requests:
        return []
    ranks, names, lengths = zip(*requests)
    out = _fetcher(len(requests))(
        tf.constant(ranks, tf.int32), tf.constant(names), tf.constant(lengths, tf.int64), tf.constant(version, tf.int64)
    )
    return [t.numpy().tobytes() for t in out]
