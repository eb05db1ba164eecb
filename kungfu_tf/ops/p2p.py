"""Point-to-point model store: save a tensor; peers request it by rank.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.ops import p2p
    >>> p2p.save("w", tf.ones([2]))
    >>> p2p.request(0, "w", like=tf.zeros([2])).numpy()
    array([1., 1.], dtype=float32)
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf._native import library


def _version(version: int | tf.Tensor | None) -> tf.Tensor:
    return tf.constant(-1, tf.int64) if version is None else tf.cast(version, tf.int64)


def save(name: str, x: tf.Tensor, version: int | tf.Tensor | None = None) -> tf.Operation | None:
    """Keeps a copy of ``x`` under ``name`` (and ``version``; None: just the latest)."""
    return library().kungfu_save(name, tf.convert_to_tensor(x), _version(version))


def request(rank: int | tf.Tensor, name: str, like: tf.Tensor, version: int | tf.Tensor | None = None) -> tf.Tensor:
    """Fetches what worker ``rank`` saved under ``name``; ``like`` gives shape and dtype.

    Raises NotFoundError if nothing was saved there, InvalidArgumentError if the
    saved tensor has a different size.
    """
    return library().kungfu_request(tf.cast(rank, tf.int32), name, _version(version), tf.convert_to_tensor(like))
