"""Keras 3 integration: callbacks for data-parallel ``model.fit`` on kungfu_tf.

Example:
    >>> import keras
    >>> import kungfu_tf
    >>> import kungfu_tf.keras as kfk
    >>> callbacks = [
    ...     kfk.BroadcastGlobalVariablesCallback(root=0),   # identical start
    ...     kfk.MetricAverageCallback(),                    # identical logs
    ...     kfk.LearningRateWarmupCallback(0.01 * kungfu_tf.size(), warmup_epochs=3),  # from 0.01
    ...     kfk.RankZeroOnly(keras.callbacks.ModelCheckpoint("best.keras")),
    ... ]
    >>> model.fit(kungfu_tf.data.shard(ds), epochs=10, verbose=kfk.verbose(),
    ...           callbacks=callbacks)  # doctest: +SKIP

A strategy searched while ``fit`` trains (``builders.Auto``) needs
``kfk.AutoSearchCallback()`` in the callbacks: its trials are fit's batches.

Elastic jobs (``kungfu-run --elastic``): ``kfk.elastic_fit`` runs ``fit`` with an
``ElasticCallback`` and re-enters it after every membership change (in place);
Horovod's ``CommitStateCallback``, ``UpdateBatchStateCallback`` and
``UpdateEpochStateCallback`` serve a ``KerasState`` in the re-run mode.
"""

from kungfu_tf.keras.auto_search_callback import AutoSearchCallback
from kungfu_tf.keras.broadcast import BroadcastGlobalVariablesCallback
from kungfu_tf.keras.elastic_callback import (
    ElasticCallback,
    elastic_fit,
    epoch_rest_dataset,
)
from kungfu_tf.keras.elastic_state_callbacks import (
    CommitStateCallback,
    UpdateBatchStateCallback,
    UpdateEpochStateCallback,
)
from kungfu_tf.keras.lr_warmup import LearningRateWarmupCallback
from kungfu_tf.keras.metric_average import MetricAverageCallback
from kungfu_tf.keras.policy_callback import PolicyCallback
from kungfu_tf.keras.rank_zero import RankZeroOnly, verbose

__all__ = [
    "AutoSearchCallback",
    "BroadcastGlobalVariablesCallback",
    "CommitStateCallback",
    "ElasticCallback",
    "LearningRateWarmupCallback",
    "MetricAverageCallback",
    "PolicyCallback",
    "RankZeroOnly",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "elastic_fit",
    "epoch_rest_dataset",
    "verbose",
]
