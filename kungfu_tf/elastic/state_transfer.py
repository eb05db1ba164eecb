"""Moving a worker's training state: the variables in C++, the Python state as JSON, one digest.

The variables travel through :mod:`kungfu_tf.ops.state_sync`: cut into
pieces that the sources send round robin (a joiner fetches a model from
several survivors at once, each sending a part: Or et al. §6, bootstrapping
new workers), straight from and into the variables' buffers, hashed in C++
as they land. The Python state (step, epoch, data position) travels as
canonical JSON through the p2p store. :func:`digest` joins the variables'
digest and that JSON, so that every worker can check, afterwards, that all
hold identical state.

Example:
    >>> from kungfu_tf.elastic.state_transfer import canonical_json, digest
    >>> canonical_json({"step": 3, "epoch": 0})
    b'{"epoch":0,"step":3}'
    >>> len(digest(b"", canonical_json({"step": 3})))
    32
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np
import tensorflow as tf

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


def digest(variables_digest: bytes, python_json: bytes) -> bytes:
    """SHA-256 of the whole state: the variables' digest (empty when they were not hashed), then the JSON."""
    h = hashlib.sha256()
    h.update(len(variables_digest).to_bytes(8, "little"))
    h.update(variables_digest)
    h.update(python_json)
    return h.digest()


def save_blob(name: str, data: bytes, version: int) -> None:
    """Keeps ``data`` in this worker's p2p store under ``name`` and ``version`` for peers to fetch."""
    p2p.save(name, tf.constant(np.frombuffer(data, np.uint8)), version=tf.constant(version, tf.int64))


def fetch_blob(rank: int, name: str, length: int, version: int) -> bytes:
    """Fetches the ``length``-byte blob worker ``rank`` saved under ``name`` with a version >= ``version``."""
    value, _ = p2p.request_at_least(rank, name, tf.constant(version, tf.int64), tf.zeros([length], tf.uint8))
    return value.numpy().tobytes()
