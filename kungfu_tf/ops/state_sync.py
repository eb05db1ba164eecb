"""Moving and hashing variables between workers in C++ (elastic state sync).

The variables' bytes, concatenated in order, are cut into 4 MiB pieces
(ops/runtime/state_pieces.h). A worker that holds the state saves its share
of the pieces straight from the variables' buffers; a receiver fetches every
piece from its source at once into fresh buffers, hashing each as it lands,
and the variables take those buffers only when all arrived. Every op returns
the state's digest (XXH3-128 over the pieces' XXH3-128, 16 bytes), the same
on every worker that holds the same bytes, however many sources sent them.
Nothing passes through Python or numpy. The digest shows that members hold
the same state, not that a peer is honest (only peers that proved the job's
secret exchange state): a fast non-cryptographic hash does that job at ~10x
SHA-256's speed (state_pieces.h).

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.ops import state_sync
    >>> w = tf.Variable([1.0, 2.0])
    >>> digest = state_sync.save_state([w], "doc/state", version=1, source=0, sources=1)
    >>> bool((digest.numpy() == state_sync.state_digest([w]).numpy()).all())
    True
    >>> _ = w.assign([0.0, 0.0]); _ = state_sync.fetch_state([w], [0], "doc/state", min_version=1)
    >>> w.numpy().tolist()
    [1.0, 2.0]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from kungfu_tf._native import library
from kungfu_tf.ops._keys import check_name


def movable(variables: Sequence[object]) -> bool:
    """Whether these ops can move ``variables``: eager resource variables (tf.Variable, Keras variables).

    Example:
        >>> import tensorflow as tf
        >>> movable([tf.Variable(1.0)]), movable([tf.constant(1.0)])
        (True, False)
    """
    return tf.executing_eagerly() and all(
        getattr(getattr(v, "handle", None), "dtype", None) == tf.resource for v in variables
    )


def _handles(variables: Sequence[object]) -> list[tf.Tensor]:
    """The resource handles of tf.Variable or Keras variables (the ops read and write the buffers behind them)."""
    out = []
    for i, v in enumerate(variables):
        handle = getattr(v, "handle", None)
        if handle is None or handle.dtype != tf.resource:
            raise TypeError(f"state sync: variables[{i}] ({type(v).__name__}) is not a resource variable")
        out.append(handle)
    return out


def state_digest(variables: Sequence[object]) -> tf.Tensor:
    """The digest (uint8[16]) of the variables' bytes, laid out as the sync sends them.

    Raises:
        InvalidArgumentError: a variable of a dtype that cannot travel as bytes (string, variant).
    """
    return library().kungfu_state_digest(_handles(variables))


def bytes_digest(data: bytes) -> bytes:
    """The digest :func:`state_digest` gives variables whose bytes, concatenated, are ``data``.

    For state that reaches Python as bytes (tf.compat.v1 session variables),
    so that it compares with state moved by these ops.

    Example:
        >>> import numpy as np, tensorflow as tf
        >>> w = tf.Variable(np.arange(4, dtype=np.float32))
        >>> bytes_digest(w.numpy().tobytes()) == bytes(state_digest([w]).numpy())
        True
    """
    return bytes(library().kungfu_bytes_digest(tf.constant(np.frombuffer(data, np.uint8))).numpy())


def save_state(
    variables: Sequence[object], blob_prefix: str, version: int, source: int, sources: int
) -> tf.Tensor:
    """Saves source ``source``'s share (of ``sources``) of the variables' pieces; returns the digest.

    The pieces stay in this worker's p2p store (under ``blob_prefix``/<piece>
    and ``version``) until :func:`forget_state`; receivers call
    :func:`fetch_state` with the same prefix, the sources' ranks in the
    same order, and a ``min_version`` <= ``version``.
    """
    return library().kungfu_state_save(
        _handles(variables),
        check_name(blob_prefix),
        tf.constant(version, tf.int64),
        tf.constant(source, tf.int32),
        tf.constant(sources, tf.int32),
    )


def fetch_state(variables: Sequence[object], source_ranks: Sequence[int], blob_prefix: str, min_version: int) -> tf.Tensor:
    """Fetches the variables' pieces from the workers ``source_ranks`` (all in parallel); returns the digest.

    Each piece is requested from its source (round robin over
    ``source_ranks``) and waits there until saved with a version >=
    ``min_version``. The variables change only if every piece arrived;
    otherwise they keep their values and the error names the piece and the
    worker: UnavailableError (a source died), DeadlineExceededError (not
    saved within the runtime timeout), InvalidArgumentError (a piece of
    another size: the sources' model differs).
    """
    return library().kungfu_state_fetch(
        _handles(variables), tf.constant(list(source_ranks), tf.int32), check_name(blob_prefix),
        tf.constant(min_version, tf.int64),
    )  # fmt: skip


def forget_state(blob_prefix: str) -> None:
    """Drops the pieces this worker saved under ``blob_prefix`` (once every receiver has them)."""
    library().kungfu_state_forget(check_name(blob_prefix))
