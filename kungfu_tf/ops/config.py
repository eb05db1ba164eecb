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
from kungfu_tf.run.worker_env.external_launch import apply_external_launch
from kungfu_tf.run.worker_env.worker_env import read_worker_env

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


def auto_probe_samples() -> tf.Tensor:
    """int32 scalar: samples AUTO's probes have started on this worker so far.

    AUTO measures a size class on a new layout one sample after each call of
    the class (kungfu_tf.ops.set_topology("AUTO")); the count stops growing
    once every class being called has decided. Code that times steps (a
    :class:`~kungfu_tf.policy.StrategyPolicy` trial) waits until it stops:
    steps that carry probe samples are slower than the layout will be.
    """
    return library().kungfu_auto_probe_samples()


def auto_choice(nbytes: int | tf.Tensor) -> tf.Tensor:
    """string scalar: the topology AUTO chose for all-reduces of ``nbytes`` bytes on this cluster version.

    Empty until the workers have agreed on one (AUTO's probe of that size
    class is still measuring, or the class was never called). Every worker
    reads the same name once it is set.

    Example:
        >>> from kungfu_tf.ops import auto_choice
        >>> auto_choice(4).numpy()   # doctest: +SKIP
        b'STAR'
    """
    return library().kungfu_auto_choice(tf.cast(nbytes, tf.int64))


def _from_env(op: Callable[[], tf.Tensor]) -> int:
    # The launcher's environment: what the runtime reads at start, so right
    # only until the cluster first changes (membership.update_cluster), so
    # current_int uses it to validate the environment, not for the value.
    # Under mpirun/srun the KUNGFU_* variables are derived first, as the
    # library does when it loads.
    apply_external_launch(os.environ)
    env = read_worker_env(os.environ)
    local = env.local_peers
    return {
        rank: env.rank,
        cluster_size: env.size,
        local_rank: local.index(env.self_address),
        local_size: len(local),
    }[op]


def _in_own_session(op: Callable[[], tf.Tensor]) -> int:
    # No eager context (v1 graph mode with eager disabled): run the op in a
    # throwaway graph and session. The runtime is per process, so this reads
    # the cluster in force now, also after an elastic change, which the
    # environment does not know of.
    with tf.Graph().as_default() as graph:
        value = op()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        return int(session.run(value))


def _no_admission() -> None:
    pass


def _no_place() -> tuple[int, int] | None:
    return None


# A joiner of an elastic job that is not admitted yet (kungfu_tf/ops/plain_joiner.py): a plain process is
# admitted first, one warming up for ElasticState.join reports its place. plain_joiner sits above this module
# (its collectives read the config), so kungfu_tf/ops/__init__.py installs both here.
_admission_check: Callable[[], None] = _no_admission
_place_before_admission: Callable[[], tuple[int, int] | None] = _no_place


def set_admission(check: Callable[[], None], place: Callable[[], tuple[int, int] | None]) -> None:
    """Installs what :func:`current_int` asks first (``plain_joiner.admit_if_plain``, ``place_before_admission``)."""
    global _admission_check, _place_before_admission
    _admission_check, _place_before_admission = check, place


def current_int(op: Callable[[], tf.Tensor]) -> int:
    """Runs a config op now and returns its value as a Python int.

    On a joiner of an elastic job that is not admitted yet, Python ints
    describe the job, tensors the runtime: a plain process is admitted
    first; one warming up for ``ElasticState.join`` (alone, a cluster of
    itself) gets the place it would take for :func:`rank` and
    :func:`cluster_size` (kungfu_tf/ops/plain_joiner.py), never rank 0.

    Example:
        >>> from kungfu_tf.ops import config
        >>> config.current_int(config.cluster_size)
        1
    """
    _admission_check()
    if op in (rank, cluster_size):
        place = _place_before_admission()
        if place is not None:
            return place[0] if op is rank else place[1]
    with tf.init_scope():
        if tf.executing_eagerly():
            return int(op())
    # Names a malformed KUNGFU_* variable (the op would only say that the
    # runtime could not start) before the runtime's value is read.
    _from_env(op)
    return _in_own_session(op)
