"""``MonitorGradientNoiseScaleOptimizer``: KungFu's name for S-SGD with a gradient noise scale monitor.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import MonitorGradientNoiseScaleOptimizer
    >>> opt = MonitorGradientNoiseScaleOptimizer(keras.optimizers.SGD(0.1), device_batch_size=32)
    >>> int(opt.kungfu_monitor.local_batch_size.numpy())
    32
"""

from __future__ import annotations

import keras
import tensorflow as tf

from kungfu_tf.optimizers.gradient_monitor import GradientMonitor
from kungfu_tf.optimizers.gradient_sync import DEFAULT_FUSION_THRESHOLD_BYTES
from kungfu_tf.optimizers.sync_sgd import SynchronousSGDOptimizer
from kungfu_tf.strategy.source import StrategySource


def MonitorGradientNoiseScaleOptimizer(  # KungFu's name, a factory like SynchronousSGDOptimizer
    opt: keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer,
    device_batch_size: int,
    smoothing: float = 0.9,
    variance_interval: int = 0,
    fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD_BYTES,
    sparse_as_dense: bool = False,
    name: str | None = None,
    strategy: StrategySource | None = None,
) -> keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer:
    """``SynchronousSGDOptimizer(opt, monitor=GradientMonitor(batch_size=device_batch_size, ...))``.

    Args:
        opt: a Keras 3 or ``tf.compat.v1.train`` optimizer.
        device_batch_size: the per-worker batch size (KungFu's argument name).
        smoothing, variance_interval: as for :class:`GradientMonitor`.
        fusion_threshold_bytes, sparse_as_dense, name, strategy: as for
            :func:`SynchronousSGDOptimizer`.

    Returns:
        The wrapped optimizer; its monitor is ``opt.kungfu_monitor`` (for a
        v1 optimizer, call this inside the training graph).

    Example:
        >>> import keras
        >>> opt = MonitorGradientNoiseScaleOptimizer(keras.optimizers.Adam(1e-3), 64, variance_interval=8)
        >>> opt.kungfu_monitor.variance_interval
        8
    """
    monitor = GradientMonitor(
        batch_size=device_batch_size, gns=True, smoothing=smoothing, variance_interval=variance_interval
    )
    return SynchronousSGDOptimizer(
        opt, fusion_threshold_bytes, sparse_as_dense, name=name, strategy=strategy, monitor=monitor
    )
