"""The cluster a strategy is built for: replicas, the host of each rank, link bandwidth.

AutoDist's resource specification R, reduced to what our builders use: how
many workers, which of them share a host (same-host traffic is cheap), and the
bandwidth between hosts when it is known (declared or measured).

Example:
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> spec = ClusterSpec(4, hosts=(0, 0, 1, 1), bandwidth_gbps=1.0)
    >>> spec.num_hosts, spec.ranks_on_host(1)
    (2, [2, 3])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterSpec:
    """``replicas`` workers; ``hosts[r]`` is the host index of rank ``r`` (default: all on one).

    ``bandwidth_gbps`` is the inter-host link bandwidth in Gbit/s, or None if
    unknown (builders then assume the hosts are equally well connected).

    Example:
        >>> ClusterSpec.uniform(replicas=4, num_hosts=2).hosts
        (0, 0, 1, 1)
    """

    replicas: int
    hosts: tuple[int, ...] | None = None
    bandwidth_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"a cluster needs at least one replica, got {self.replicas}")
        if self.hosts is not None and len(self.hosts) != self.replicas:
            raise ValueError(f"hosts names {len(self.hosts)} ranks but the cluster has {self.replicas} replicas")
        if self.bandwidth_gbps is not None and self.bandwidth_gbps <= 0:
            raise ValueError(f"bandwidth_gbps must be > 0, got {self.bandwidth_gbps}")

    @classmethod
    def uniform(cls, replicas: int, num_hosts: int = 1, bandwidth_gbps: float | None = None) -> ClusterSpec:
        """``replicas`` ranks spread over ``num_hosts`` hosts in consecutive blocks."""
        if num_hosts < 1 or num_hosts > replicas:
            raise ValueError(f"cannot spread {replicas} replicas over {num_hosts} hosts")
        per_host = -(-replicas // num_hosts)
        return cls(replicas, tuple(r // per_host for r in range(replicas)), bandwidth_gbps)

    @classmethod
    def current(cls, bandwidth_gbps: float | None = None) -> ClusterSpec:
        """The running job's cluster (one replica outside ``kungfu-run``).

        Hosts come from the runtime's peer list (host:port per rank, as the
        cluster is now: the launcher's ``KUNGFU_PEERS`` is the first
        cluster's, stale after an elastic change): ranks with the same host
        string share a host.
        """
        import os

        import tensorflow as tf

        import kungfu_tf
        from kungfu_tf.ops import membership

        n = kungfu_tf.size()
        with tf.init_scope():  # an optimizer may be built while a tf.function traces its step
            if tf.executing_eagerly():
                peers = [str(p) for p in membership.cluster_peers()]
            else:  # eager execution off (a v1 graph): the launcher's list, right until a membership change
                peers = [p for p in os.environ.get("KUNGFU_PEERS", "").split(",") if p]
        if len(peers) != n:
            return cls(n, None, bandwidth_gbps)
        return cls.of_peers(peers, bandwidth_gbps)

    @classmethod
    def of_peers(cls, peers: Sequence[str], bandwidth_gbps: float | None = None) -> ClusterSpec:
        """The cluster of ``peers`` ("host:port" in rank order): ranks with the same host share a host.

        Example:
            >>> ClusterSpec.of_peers(["a:1", "a:2", "b:1"]).hosts
            (0, 0, 1)
        """
        names: dict[str, int] = {}
        hosts = tuple(names.setdefault(p.rsplit(":", 1)[0], len(names)) for p in peers)
        return cls(len(peers), hosts, bandwidth_gbps)

    @property
    def num_hosts(self) -> int:
        """Number of distinct hosts."""
        return 1 if self.hosts is None else len(set(self.hosts))

    def host_of(self, rank: int) -> int:
        """Host index of ``rank``."""
        return 0 if self.hosts is None else self.hosts[rank]

    def ranks_on_host(self, host: int) -> list[int]:
        """Ranks placed on host ``host``, in rank order."""
        return [r for r in range(self.replicas) if self.host_of(r) == host]
