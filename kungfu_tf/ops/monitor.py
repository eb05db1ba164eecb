"""Monitoring ops over the runtime's counters.

Example:
    >>> from kungfu_tf.ops import monitor
    >>> monitor.comm_rates().shape  # one rate per worker
    TensorShape([1])
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf._native import library


def comm_rates() -> tf.Tensor:
    """float64 [np]: bytes/s exchanged with each peer since the previous call (0 for self)."""
    return library().kungfu_comm_rates()
