"""``Agreement``: the collectives of one policy round (KungFu Alg. 1 on serialized values).

A round runs on every worker after each hook phase that some policy uses:

1. one all-reduce (max) of this worker's status: nothing requested, changes
   requested, or a hook failed. Most rounds end here, cheaply.
2. On a failure, the workers exchange their error messages, so that every
   worker raises (see :class:`PeerPolicyError`) instead of waiting for the
   failed one until the timeout.
3. Otherwise the requests, serialized to canonical bytes, go through
   ``ops.consensus``; if they differ, the workers exchange them to name the
   setting and each rank's value, and nothing is applied anywhere.
4. After applying, a barrier: no worker starts the next step before every
   worker has the new values.

Eager ops, under ``tf.init_scope`` so a v1 hook (inside a ``tf.Graph``) can
use them too. Keys are fixed names, reused once the previous use completed.

Example:
    >>> from kungfu_tf.policy.agreement import Agreement
    >>> a = Agreement()
    >>> a.status(1), a.agree(b"batch_size=64"), a.gather_text("ok")  # one worker
    (1, True, ['ok'])
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective

IDLE, CHANGES, FAILED = 0, 1, 2


class Agreement:
    """The collectives of a round, with keys under ``prefix``."""

    def __init__(self, prefix: str = "kungfu_policy"):
        self.prefix = prefix

    def status(self, mine: int) -> int:
        """The largest status over all workers (IDLE < CHANGES < FAILED)."""
        with tf.init_scope():
            out = collective.all_reduce(tf.constant([mine], tf.int32), op="max", name=f"{self.prefix}/status")
            return int(out.numpy()[0])

    def agree(self, payload: bytes) -> bool:
        """True on every worker iff all passed the same bytes (Alg. 1)."""
        with tf.init_scope():
            data = tf.constant(np.frombuffer(payload, np.uint8) if payload else np.zeros([0], np.uint8))
            return bool(collective.consensus(data, name=f"{self.prefix}/consensus").numpy())

    def gather_text(self, text: str) -> list[str]:
        """Every worker's ``text``, by rank (padded to the longest, then all-gathered)."""
        raw = text.encode("utf-8")
        with tf.init_scope():
            longest = collective.all_reduce(tf.constant([len(raw)], tf.int64), op="max", name=f"{self.prefix}/text_len")
            padded = np.zeros([int(longest.numpy()[0])], np.uint8)
            padded[: len(raw)] = np.frombuffer(raw, np.uint8)
            rows = collective.all_gather(tf.constant(padded), name=f"{self.prefix}/text").numpy()
        return [bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in rows]

    def barrier(self) -> None:
        with tf.init_scope():
            collective.barrier(name=f"{self.prefix}/barrier")
