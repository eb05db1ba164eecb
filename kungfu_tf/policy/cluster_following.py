"""What the runner knows of the cluster (rank, size, members, topology), read again after every change.

In an elastic job membership changes are applied at step boundaries
(``ElasticState.check``, a resize); :meth:`ClusterFollower.follow` makes the
runner read rank and size again after every change this worker applies, so
the next step is counted with the new cluster's global batch on every
worker, members and joiners alike (or their ``state_dict``, compared by the
elastic sync, would differ).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kungfu_tf.ops import config, membership


def read_rank_and_size() -> tuple[int, int]:
    """This worker's rank and the cluster's size, now."""
    with tf.init_scope():
        return config.current_int(config.rank), config.current_int(config.cluster_size)


def read_topology() -> str:
    with tf.init_scope():
        return config.topology().numpy().decode()


class ClusterFollower:
    """The members and this worker's address (read when first asked for after each :meth:`forget`)."""

    def __init__(self) -> None:
        self._peers: tuple[str, ...] | None = None
        self._self_peer: str | None = None
        self._stop_following: Callable[[], None] | None = None  # removes the elastic apply listener

    @property
    def peers(self) -> tuple[str, ...]:
        if self._peers is None:
            self._peers = tuple(_run_now(membership.cluster_peers))
        return self._peers

    @peers.setter
    def peers(self, value: Sequence[str]) -> None:
        self._peers = tuple(value)

    def forget(self) -> None:
        """The cluster changed: read the members again when next asked."""
        self._peers = None

    @property
    def self_peer(self) -> str:
        if self._self_peer is None:
            self._self_peer = _run_now(membership.self_peer)
        return self._self_peer

    @staticmethod
    def size_bounds() -> tuple[int, int] | None:
        """The elastic job's ``(--min-np, --max-np)`` (max 0: unbounded), None outside an elastic job."""
        from kungfu_tf.ops import elastic_membership as em

        if not em.is_elastic():
            return None
        state = em.job_state()
        return int(state.min_size), int(state.max_size)

    def follow(self, on_change: Callable[[Any], None]) -> None:
        """In an elastic job, calls ``on_change(change)`` after every membership change this worker applies (once)."""
        from kungfu_tf.ops import elastic_membership as em

        if self._stop_following is None and em.is_elastic():
            # First: the batch and learning rate follow the new size before the state syncs.
            self._stop_following = em.add_apply_listener(on_change, first=True)


def _run_now(op: Any) -> Any:
    """A membership op's value (a str or a list of str) now, eagerly or, in a v1 graph, in its own session."""
    with tf.init_scope():
        if tf.executing_eagerly():
            return op()
    with tf.Graph().as_default() as graph:
        value = op()
    with tf.compat.v1.Session(graph=graph) as session:
        out = session.run(value)
    return out.decode() if isinstance(out, bytes) else [p.decode() for p in out]
