"""Membership ops for elastic training: change the cluster in place.

A worker switches to a new cluster version with :func:`update_cluster` (its
process, graphs and variables stay; operations in flight on the old version
fail with ``UnavailableError``), leaves with :func:`leave_cluster`, and a
watcher thread can :func:`interrupt` a step that waits for a lost peer.
Eagerly every function returns Python values; inside ``tf.function`` (or a
v1 graph) it returns the op or tensor.

Example (a one-worker run: the cluster is just this worker):
    >>> from kungfu_tf.ops import membership
    >>> me = membership.self_peer()
    >>> membership.cluster_peers() == [me]
    True
    >>> membership.lost_peers()
    []
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from kungfu_tf._native import library

__all__ = ["cluster_peers", "interrupt", "leave_cluster", "lost_peers", "self_peer", "update_cluster"]

_MAX_VERSION = 2**32 - 1


def _strings(t: tf.Tensor) -> list[str] | tf.Tensor:
    return [p.decode() for p in t.numpy()] if tf.executing_eagerly() else t


def _check_peers(peers: Sequence[str]) -> list[str]:
    # A lone string is a sequence of characters: refuse it instead of
    # reading "127.0.0.1:10000" as 15 one-letter peers.
    if isinstance(peers, (str, bytes)) or not isinstance(peers, Sequence):
        raise TypeError(f"update_cluster: peers must be a sequence of 'host:port' strings, got {peers!r}")
    if not peers:
        raise ValueError("update_cluster: peers must list at least one 'host:port', got []")
    for i, p in enumerate(peers):
        if not isinstance(p, str):
            raise TypeError(f"update_cluster: peers[{i}] must be a 'host:port' string, got {p!r}")
    return list(peers)


def update_cluster(peers: Sequence[str], version: int) -> tf.Operation | None:
    """Switches this worker to cluster ``version`` with ``peers`` (rank order).

    Atomic: ops in flight on the old version fail with ``UnavailableError``
    ("cluster changed to version N"), links to departed peers close in
    order, the listening port stays bound, new links open on first use.
    ``rank()``, ``cluster_size()``, ``cluster_version()`` and ``topology()``
    read the new cluster as soon as it returns; p2p blobs and accumulators
    are kept.

    Raises:
        TypeError / ValueError: ``peers`` is not a non-empty sequence of
            strings, or ``version`` is not an int in 1..2**32-1.
        tf.errors.InvalidArgumentError: this worker (KUNGFU_SELF) is not in
            ``peers``, a peer is listed twice or malformed, or ``version`` is
            not greater than the current one.

    Example (every member of the new cluster calls it with the same list):
        >>> from kungfu_tf.ops import membership
        >>> membership.update_cluster(["10.0.0.1:10000", "10.0.0.2:10000"], 2)  # doctest: +SKIP
    """
    peers = _check_peers(peers)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= _MAX_VERSION:
        raise ValueError(f"update_cluster: version must be an int in 1..{_MAX_VERSION}, got {version!r}")
    return library().kungfu_update_cluster(peers=tf.constant(peers, tf.string), version=tf.constant(version, tf.int64))


def leave_cluster() -> tf.Operation | None:
    """Leaves the cluster in order: queued frames are written and peers told
    goodbye (they fail only what still waits for us, without counting us as
    lost); every later op of this worker fails.

    Example (the last thing a detached worker does before it exits):
        >>> from kungfu_tf.ops import membership
        >>> membership.leave_cluster()  # doctest: +SKIP
    """
    return library().kungfu_leave_cluster()


def interrupt(reason: str) -> tf.Operation | None:
    """Fails every op in flight on the current cluster version now, and every
    new one until the next :func:`update_cluster`, with
    ``UnavailableError(reason)``. Thread-safe: meant for a watcher thread
    while the training thread is blocked inside a step.

    Example:
        >>> import threading
        >>> from kungfu_tf.ops import membership
        >>> threading.Thread(target=membership.interrupt, args=("peer lost",)).start()  # doctest: +SKIP
    """
    if not isinstance(reason, str) or not reason:
        raise ValueError(f"interrupt: reason must be a non-empty string, got {reason!r}")
    return library().kungfu_interrupt(reason=reason)


def lost_peers() -> list[str] | tf.Tensor:
    """``host:port`` of the current version's members whose connection broke
    without a goodbye (crash, reset, connect timeout), in rank order.

    Example:
        >>> from kungfu_tf.ops import membership
        >>> membership.lost_peers()
        []
    """
    return _strings(library().kungfu_lost_peers())


def cluster_peers() -> list[str] | tf.Tensor:
    """The current cluster's ``host:port`` in rank order.

    Example:
        >>> from kungfu_tf.ops import membership
        >>> len(membership.cluster_peers())
        1
    """
    return _strings(library().kungfu_cluster_peers())


def self_peer() -> str | tf.Tensor:
    """This worker's ``host:port`` (KUNGFU_SELF).

    Example:
        >>> from kungfu_tf.ops import membership
        >>> membership.self_peer() in membership.cluster_peers()
        True
    """
    t = library().kungfu_self_peer()
    return t.numpy().decode() if tf.executing_eagerly() else t
