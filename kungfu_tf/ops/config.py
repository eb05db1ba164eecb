"""Configuration ops: read the runtime at every run (never folded to constants).

Example:
    >>> from kungfu_tf.ops import config
    >>> int(config.cluster_size())
    1
"""

from __future__ import annotations

import os
from collections.abc import Callable

import tensorflow as tf

from kungfu_tf._native import library
from kungfu_tf.run.worker_env import read_worker_env

# The runtime's all-reduce topologies (ops/runtime/topology.h), in its spelling.
TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE", "AUTO")


def topology_name(name: str) -> str:
    """``name`` (any case) as the runtime spells it; ValueError listing the valid names."""
    upper = name.upper() if isinstance(name, str) else None
    if upper not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}; valid: {', '.join(TOPOLOGIES)}")
    return upper


def rank() -> tf.Tensor:
    """int32 scalar: this worker's rank."""
    return library().kungfu_rank()


def cluster_size() -> tf.Tensor:
    """int32 scalar: number of workers."""
    return library().kungfu_cluster_size()


def local_rank() -> tf.Tensor:
    """int32 scalar: position among the workers on this host."""
    return library().kungfu_local_rank()


def local_size() -> tf.Tensor:
    """int32 scalar: number of workers on this host."""
    return library().kungfu_local_size()


def cluster_version() -> tf.Tensor:
    """int32 scalar: cluster membership version (changes on resize)."""
    return library().kungfu_cluster_version()


def topology() -> tf.Tensor:
    """string scalar: the all-reduce topology in force."""
    return library().kungfu_topology()


def _from_env(op: Callable[[], tf.Tensor]) -> int:
    # Used only where no eager context exists (v1 graph mode with eager
    # disabled): the launcher's environment is what the runtime reads at start.
    env = read_worker_env(os.environ)
    local = env.local_peers
    return {
        rank: env.rank,
        cluster_size: env.size,
        local_rank: local.index(env.self_address),
        local_size: len(local),
    }[op]


def current_int(op: Callable[[], tf.Tensor]) -> int:
    """Runs a config op now and returns its value as a Python int."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return int(op())
    return _from_env(op)
