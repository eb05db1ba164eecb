"""Moving a worker's training state as bytes: flattening, slicing, fetching in parallel, digests.

The variables' values are concatenated into one byte string (whatever their
dtypes), cut into as many contiguous slices as there are sources, and slice
``j`` travels from source ``j``: a joiner fetches a model from several
survivors at once, each sending a part (Or et al. §6: bootstrapping new
workers). The Python state travels as canonical JSON. A SHA-256 digest of
both lets every worker check, afterwards, that all hold identical state.

Example:
    >>> import numpy as np
    >>> from kungfu_tf.elastic.state_transfer import slice_bounds
    >>> slice_bounds(10, 3)
    [(0, 3), (3, 6), (6, 10)]
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.elastic.signature import variable_dtype, variable_name
from kungfu_tf.ops import p2p


def canonical_json(value: Any) -> bytes:
    """``value`` as JSON bytes that are equal wherever the value is (sorted keys, no spaces).

    Raises:
        TypeError: naming the part that is not JSON-able.
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"elastic state: the Python state must be JSON-able: {e}") from None


def variable_bytes(variables: Sequence[object]) -> bytes:
    """The values of ``variables`` concatenated as raw bytes, in order."""
    return b"".join(np.ascontiguousarray(np.asarray(v.numpy())).tobytes() for v in variables)


def assign_from_bytes(variables: Sequence[object], data: bytes | np.ndarray) -> None:
    """Assigns each variable its part of ``data`` (as laid out by :func:`variable_bytes`).

    Raises:
        ValueError: ``data`` has another length than the variables need.
    """
    buf = memoryview(np.ascontiguousarray(np.frombuffer(data, np.uint8)))
    sizes = [variable_dtype(v).size * int(np.prod(tf.TensorShape(v.shape).as_list(), dtype=np.int64)) for v in variables]
    if sum(sizes) != len(buf):
        raise ValueError(f"elastic state: received {len(buf)} bytes of variables, this model has {sum(sizes)}")
    offset = 0
    for v, n in zip(variables, sizes):
        dtype = variable_dtype(v).as_numpy_dtype
        value = np.frombuffer(buf[offset : offset + n], dtype=dtype).reshape(tf.TensorShape(v.shape).as_list())
        try:
            v.assign(value)
        except Exception as e:
            raise ValueError(f"elastic state: cannot assign variable {variable_name(v)!r}: {e}") from e
        offset += n


def slice_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous [start, end) ranges that cover ``total`` bytes, sizes differing by at most 1."""
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    return [(total * j // parts, total * (j + 1) // parts) for j in range(parts)]


def digest(variable_data: bytes, python_json: bytes) -> bytes:
    """SHA-256 of the whole state (variables' bytes, then the Python state's JSON)."""
    h = hashlib.sha256()
    h.update(len(variable_data).to_bytes(8, "little"))
    h.update(variable_data)
    h.update(python_json)
    return h.digest()


def save_blob(name: str, data: bytes, version: int) -> None:
    """Keeps ``data`` in this worker's p2p store under ``name`` and ``version`` for peers to fetch."""
    p2p.save(name, tf.constant(np.frombuffer(data, np.uint8)), version=tf.constant(version, tf.int64))


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
