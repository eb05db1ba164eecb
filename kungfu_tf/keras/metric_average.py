"""Keras callback: every worker reports the cluster-wide mean of each epoch metric.

Example:
    >>> import kungfu_tf.keras as kfk
    >>> model.fit(x, y, callbacks=[kfk.MetricAverageCallback()])  # doctest: +SKIP
"""

from __future__ import annotations

from numbers import Real
from typing import Any

import keras
import tensorflow as tf

from kungfu_tf.ops import collective


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replaces every numeric value in ``logs`` by its
    mean over all workers.

    Each worker computes its metrics on its own shard of the data, so their
    logs differ; after this callback every worker (and every later callback:
    History, the progress bar, ModelCheckpoint's ``monitor``, EarlyStopping)
    sees the same numbers. Put it before the callbacks that read the logs.
    All values travel in one float64 all-reduce; workers must log the same
    metric names (a different count fails with ``InvalidArgumentError``).

    Example:
        >>> from kungfu_tf.keras import MetricAverageCallback
        >>> callbacks = [MetricAverageCallback(), keras.callbacks.EarlyStopping()]  # doctest: +SKIP
    """

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs:
            return
        # Sorted keys: dict order may differ across workers, positions must not.
        keys = sorted(k for k, v in logs.items() if isinstance(v, Real) and not isinstance(v, bool))
        if not keys:
            return
        values = tf.constant([float(logs[k]) for k in keys], dtype=tf.float64)
        means = collective.all_reduce(values, op="mean", name="keras_metric_average").numpy()
        # In place: Keras passes this same dict to the callbacks after us.
        for k, m in zip(keys, means):
            logs[k] = float(m)
