"""``tf.compat.v1`` integration: SessionRunHooks for graph-mode training on kungfu_tf.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.v1 import BroadcastGlobalVariablesHook
    >>> with tf.compat.v1.train.MonitoredTrainingSession(hooks=[BroadcastGlobalVariablesHook()]) as sess:
    ...     sess.run(train_op)  # doctest: +SKIP
"""

from kungfu_tf.v1.elastic_hook import (
    ElasticHook,
    ElasticSessionCreator,
    SessionVariable,
    session_variables,
)
from kungfu_tf.v1.hooks import BroadcastGlobalVariablesHook
from kungfu_tf.v1.policy_hook import PolicyHook

__all__ = [
    "BroadcastGlobalVariablesHook",
    "ElasticHook",
    "ElasticSessionCreator",
    "PolicyHook",
    "SessionVariable",
    "session_variables",
]
