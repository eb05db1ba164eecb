"""kungfu_tf ops: collectives, configuration, adaptation, monitoring, p2p.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf import ops
    >>> ops.all_reduce(tf.ones([3]), op="sum").numpy()  # one worker: unchanged
    array([1., 1., 1.], dtype=float32)
"""

from kungfu_tf.ops.adapt import set_topology
from kungfu_tf.ops.collective import (
    all_gather,
    all_reduce,
    barrier,
    broadcast,
    consensus,
    group_all_reduce,
    keep_alive,
    reduce,
)
from kungfu_tf.ops.config import (
    cluster_size,
    cluster_version,
    local_rank,
    local_size,
    rank,
    topology,
)
from kungfu_tf.ops.monitor import comm_bytes, comm_rates
from kungfu_tf.ops.p2p import (
    push,
    push_rows,
    request,
    request_at_least,
    request_rows,
    save,
    save_rows,
    take,
    take_rows,
)

__all__ = [
    "all_gather",
    "all_reduce",
    "barrier",
    "broadcast",
    "cluster_size",
    "cluster_version",
    "comm_bytes",
    "comm_rates",
    "consensus",
    "group_all_reduce",
    "keep_alive",
    "local_rank",
    "local_size",
    "push",
    "push_rows",
    "rank",
    "reduce",
    "request",
    "request_at_least",
    "request_rows",
    "save",
    "save_rows",
    "set_topology",
    "take",
    "take_rows",
    "topology",
]
