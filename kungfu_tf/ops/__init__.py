"""kungfu_tf ops: collectives, configuration, adaptation, monitoring, p2p.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf import ops
    >>> ops.all_reduce(tf.ones([3]), op="sum").numpy()  # one worker: unchanged
    array([1., 1., 1.], dtype=float32)
"""

from kungfu_tf.ops import collective as _collective
from kungfu_tf.ops import config as _config
from kungfu_tf.ops import plain_joiner as _plain_joiner
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
    auto_choice,
    auto_probe_samples,
    cluster_size,
    cluster_version,
    local_rank,
    local_size,
    rank,
    topology,
)
from kungfu_tf.ops.monitor import (
    comm_bytes,
    comm_rates,
    gns_estimates,
    gns_update,
    mean_variance,
    pair_squared_norms,
    squared_norm,
    squares,
    step_clock_lap,
    step_clock_start,
)
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

# The function shadows its module's name here, on purpose: kungfu_tf.ops.resize(n) as in KungFu.
from kungfu_tf.ops.resize import resize

# Every collective and every Python int of the cluster first admits a joiner that is a plain process
# (plain_joiner.py). Wired here, above the three modules: plain_joiner uses the collectives and the
# config, so neither may import it back.
_collective.set_admission_check(_plain_joiner.admit_if_plain)
_config.set_admission(_plain_joiner.admit_if_plain, _plain_joiner.place_before_admission)
del _collective, _config, _plain_joiner

__all__ = [
    "all_gather",
    "all_reduce",
    "auto_choice",
    "auto_probe_samples",
    "barrier",
    "broadcast",
    "cluster_size",
    "cluster_version",
    "comm_bytes",
    "comm_rates",
    "consensus",
    "gns_estimates",
    "gns_update",
    "group_all_reduce",
    "keep_alive",
    "local_rank",
    "local_size",
    "mean_variance",
    "pair_squared_norms",
    "push",
    "push_rows",
    "rank",
    "reduce",
    "request",
    "request_at_least",
    "request_rows",
    "resize",
    "save",
    "save_rows",
    "set_topology",
    "squared_norm",
    "squares",
    "step_clock_lap",
    "step_clock_start",
    "take",
    "take_rows",
    "topology",
]
