"""Input pipelines for data-parallel training: ``shard``, ``adaptive_batch`` and ``ElasticSampler``.

Example:
    >>> import tensorflow as tf
    >>> import kungfu_tf.data
    >>> [int(i) for i in kungfu_tf.data.shard(tf.data.Dataset.range(4))]  # one worker
    [0, 1, 2, 3]
"""

from kungfu_tf.data.adaptive_batch import adaptive_batch
from kungfu_tf.data.elastic_sampler import ElasticSampler
from kungfu_tf.data.shard import UnevenShardsError, shard

__all__ = ["ElasticSampler", "UnevenShardsError", "adaptive_batch", "shard"]
