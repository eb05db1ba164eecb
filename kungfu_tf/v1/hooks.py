"""``tf.compat.v1`` SessionRunHook: start every worker from root's global variables.

Example:
    >>> from kungfu_tf.v1 import BroadcastGlobalVariablesHook
    >>> with tf.compat.v1.train.MonitoredTrainingSession(hooks=[BroadcastGlobalVariablesHook()]) as sess:
    ...     sess.run(train_op)  # doctest: +SKIP
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf.variables import broadcast_variables


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Assigns all ``tf.compat.v1.global_variables()`` root's values when a session starts.

    ``begin()`` builds the broadcast op over the global variables that exist
    then (the model, the optimizer's slots, the global step), before
    ``MonitoredTrainingSession`` finalizes the graph; ``after_create_session``
    runs it, after the variables were initialized (or restored) and before
    the first training step. Every worker must build the same graph.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.v1 import BroadcastGlobalVariablesHook
        >>> hooks = [BroadcastGlobalVariablesHook(root=0)]
        >>> with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:  # doctest: +SKIP
        ...     while not sess.should_stop():
        ...         sess.run(train_op)
    """

    def __init__(self, root: int = 0):
        self.root = root
        self.bcast_op: tf.Operation | None = None

    def begin(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        # Keys are used once per graph: a second session on the same graph
        # reuses the op instead of building a clashing one.
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            self.bcast_op = broadcast_variables(
                tf.compat.v1.global_variables(), root=self.root, name="v1_broadcast_global_variables"
            )

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        session.run(self.bcast_op)
