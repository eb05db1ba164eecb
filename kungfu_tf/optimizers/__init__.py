"""Distributed optimizers built on kungfu_tf collectives.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
"""

from kungfu_tf.optimizers.distributed_gradient_tape import DistributedGradientTape
from kungfu_tf.optimizers.gradient_monitor import GradientMonitor
from kungfu_tf.optimizers.gradient_sync import (
    DEFAULT_FUSION_THRESHOLD_BYTES,
    average_gradients,
)
from kungfu_tf.optimizers.monitor_gns import MonitorGradientNoiseScaleOptimizer
from kungfu_tf.optimizers.pair_averaging import PairAveragingOptimizer
from kungfu_tf.optimizers.pair_averaging_v1 import PairAveragingOptimizerV1
from kungfu_tf.optimizers.stale_copies import sync_stale_copies
from kungfu_tf.optimizers.strategy_switch import SwitchReport, switch_strategy
from kungfu_tf.optimizers.sync_averaging import SynchronousAveragingOptimizer
from kungfu_tf.optimizers.sync_averaging_v1 import SynchronousAveragingOptimizerV1
from kungfu_tf.optimizers.sync_sgd import SynchronousSGDOptimizer
from kungfu_tf.optimizers.sync_sgd_v1 import SynchronousSGDOptimizerV1

__all__ = [
    "DEFAULT_FUSION_THRESHOLD_BYTES",
    "DistributedGradientTape",
    "GradientMonitor",
    "MonitorGradientNoiseScaleOptimizer",
    "PairAveragingOptimizer",
    "PairAveragingOptimizerV1",
    "SwitchReport",
    "SynchronousAveragingOptimizer",
    "SynchronousAveragingOptimizerV1",
    "SynchronousSGDOptimizer",
    "SynchronousSGDOptimizerV1",
    "average_gradients",
    "switch_strategy",
    "sync_stale_copies",
]
