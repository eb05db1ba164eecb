"""``SummaryLog``: rank 0's TensorBoard event file of monitored values, adapted parameters and decisions.

Written with ``tf.summary.write`` and TensorBoard's plugin metadata
("scalars", "text"), so TensorBoard shows them as its own scalar and text
summaries while the ``tensorboard`` package itself is optional.

Example:
    >>> from kungfu_tf.policy.summary_log import SummaryLog
    >>> log = SummaryLog("/tmp/kungfu_tb")  # doctest: +SKIP
    >>> log.scalars(3, {"gns": 120.5, "link_rates": [0.0, 1e6], "topology": "RING"})  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from kungfu_tf.ops.config import TOPOLOGIES


def _metadata(plugin: str) -> bytes:
    meta = tf.compat.v1.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    return meta.SerializeToString()


_SCALAR = _metadata("scalars")
_TEXT = _metadata("text")


class SummaryLog:
    """Writes ``policy/<name>`` scalars to an event file in ``log_dir`` (eagerly, whatever graph is default).

    Numbers become one scalar each; lists one scalar per position
    (``policy/link_rates/1`` is the rate to rank 1); the topology its index
    in :data:`kungfu_tf.ops.config.TOPOLOGIES` (and a text summary when it
    changes); NaN and infinite values are skipped (a statistic not computed
    yet). Decisions go to the text summary ``policy/decisions``.
    """

    def __init__(self, log_dir: str):
        with tf.init_scope():
            self.writer = tf.summary.create_file_writer(str(log_dir))
        self._topology: str | None = None

    def scalars(self, step: int, values: Mapping[str, object]) -> None:
        with tf.init_scope(), self.writer.as_default():
            for name, value in sorted(values.items()):
                if name == "topology" and isinstance(value, str):
                    if value != self._topology:
                        self._topology = value
                        tf.summary.write("policy/topology_name", tf.constant(value), step=step, metadata=_TEXT)
                    value = TOPOLOGIES.index(value) if value in TOPOLOGIES else -1
                if isinstance(value, (list, tuple)):
                    for i, v in enumerate(value):
                        self._scalar(f"policy/{name}/{i}", v, step)
                else:
                    self._scalar(f"policy/{name}", value, step)

    def text(self, step: int, tag: str, text: str) -> None:
        with tf.init_scope(), self.writer.as_default():
            tf.summary.write(f"policy/{tag}", tf.constant(text), step=step, metadata=_TEXT)

    def flush(self) -> None:
        with tf.init_scope():
            self.writer.flush()

    @staticmethod
    def _scalar(tag: str, value: object, step: int) -> None:
        # numpy numbers too (a policy's statistics often are np.float64/np.float32); bools are not scalars
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            return
        if not math.isfinite(value):
            return
        tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=_SCALAR)
