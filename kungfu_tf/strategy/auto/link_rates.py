"""Measured (or assumed) speed of every link of a cluster: bandwidth and latency per ordered pair of ranks.

The cost model (:mod:`kungfu_tf.strategy.auto.cost_model`) prices every byte a
strategy moves on the link it crosses, so it needs a rate per link, not one
number for the cluster: a cross-host link may be ten times slower than the
links inside a host, and the busiest slow link bounds the step. Rates come
from :func:`kungfu_tf.strategy.auto.calibration.calibrate` on a running job,
or from :meth:`LinkRates.uniform` offline (tests, ``kungfu-strategy explain``).

Example:
    >>> from kungfu_tf.strategy.auto.link_rates import LinkRates
    >>> rates = LinkRates.uniform(4, bandwidth=1e9, latency=50e-6, hosts=(0, 0, 1, 1), cross_host_bandwidth=1.25e8)
    >>> rates.bandwidth[0][1], rates.bandwidth[0][2]
    (1000000000.0, 125000000.0)
    >>> rates.signature
    'np=4 hosts=0,0,1,1'
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError

Matrix = tuple[tuple[float, ...], ...]


def _matrix(values: Any, n: int, what: str) -> Matrix:
    a = np.asarray(values, dtype=np.float64)
    if a.shape != (n, n):
        raise StrategyError(f"link rates: {what} must be a {n}x{n} matrix (one row per rank), got shape {a.shape}")
    off = a[~np.eye(n, dtype=bool)]
    if not np.all(np.isfinite(off)):
        raise StrategyError(f"link rates: {what} has a non-finite entry between two ranks")
    a = np.where(np.eye(n, dtype=bool), 0.0, a)  # a rank's link to itself is never used: stored as 0
    return tuple(tuple(float(x) for x in row) for row in a)


def host_layout(hosts: Sequence[Any]) -> tuple[int, ...]:
    """Host labels renumbered 0, 1, ... in order of first appearance (what a signature compares).

    Example:
        >>> host_layout(["b", "b", "a"])
        (0, 0, 1)
    """
    names: dict[Any, int] = {}
    return tuple(names.setdefault(h, len(names)) for h in hosts)


@dataclass(frozen=True)
class LinkRates:
    """Bandwidth (bytes/s) and latency (s) from rank i to rank j, and each rank's host.

    ``bandwidth[i][j]`` is how fast bytes sent by rank i arrive at rank j;
    ``latency[i][j]`` the fixed cost of one message from i to j (for a
    measured cluster: what a tiny request costs end to end, dispatch
    included). Diagonal entries are unused (stored as 0). ``hosts[r]`` is rank r's host
    index (ranks with the same index share a host). ``origin`` says where
    the numbers came from ("uniform", "probe", "cache", "file") and is not
    part of equality.

    Example:
        >>> r = LinkRates.uniform(2, bandwidth=2e9, latency=1e-4)
        >>> r.replicas, r.origin, LinkRates.from_json(r.to_json()) == r
        (2, 'uniform', True)
    """

    hosts: tuple[int, ...]
    bandwidth: Matrix
    latency: Matrix
    origin: str = field(default="uniform", compare=False)

    def __post_init__(self) -> None:
        n = len(self.hosts)
        if n < 1:
            raise StrategyError("link rates need at least one rank")
        object.__setattr__(self, "hosts", host_layout(self.hosts))
        object.__setattr__(self, "bandwidth", _matrix(self.bandwidth, n, "bandwidth"))
        object.__setattr__(self, "latency", _matrix(self.latency, n, "latency"))
        for i in range(n):
            for j in range(n):
                if i != j and not self.bandwidth[i][j] > 0:
                    raise StrategyError(
                        f"link rates: bandwidth from rank {i} to rank {j} is {self.bandwidth[i][j]}; it must be > 0"
                    )
                if i != j and self.latency[i][j] < 0:
                    raise StrategyError(
                        f"link rates: latency from rank {i} to rank {j} is {self.latency[i][j]}; it must be >= 0"
                    )

    @classmethod
    def from_matrices(
        cls, hosts: Sequence[Any], bandwidth: Any, latency: Any, origin: str = "uniform"
    ) -> LinkRates:
        """Rates from any array-likes ([n, n]) and any host labels (renumbered by first appearance).

        Example:
            >>> LinkRates.from_matrices(["h", "h"], [[0, 5e8], [5e8, 0]], [[0, 1e-4], [1e-4, 0]]).bandwidth[1][0]
            500000000.0
        """
        n = len(hosts)
        return cls(host_layout(hosts), _matrix(bandwidth, n, "bandwidth"), _matrix(latency, n, "latency"), origin)

    @property
    def replicas(self) -> int:
        """Number of ranks."""
        return len(self.hosts)

    @property
    def signature(self) -> str:
        """The cluster these rates describe: size and host layout (the calibration cache's key)."""
        return cluster_signature(self.hosts)

    def bandwidth_matrix(self) -> np.ndarray:
        """[n, n] float64 bandwidth in bytes/s (diagonal: inf, a rank never waits for itself)."""
        a = np.array(self.bandwidth, dtype=np.float64)
        np.fill_diagonal(a, math.inf)
        return a

    def latency_matrix(self) -> np.ndarray:
        """[n, n] float64 latency in seconds (diagonal: 0)."""
        a = np.array(self.latency, dtype=np.float64)
        np.fill_diagonal(a, 0.0)
        return a

    def check_cluster(self, cluster: ClusterSpec) -> None:
        """StrategyError unless these rates describe ``cluster`` (same size and host layout).

        Example:
            >>> LinkRates.uniform(2, 1e9, 1e-4).check_cluster(ClusterSpec(4))
            Traceback (most recent call last):
            ...
            kungfu_tf.strategy.errors.StrategyError: link rates describe 2 ranks (np=2 hosts=0,0) but the cluster has 4 replicas
        """
        if cluster.replicas != self.replicas:
            raise StrategyError(
                f"link rates describe {self.replicas} ranks ({self.signature}) but the cluster has"
                f" {cluster.replicas} replicas"
            )
        hosts = host_layout(cluster.hosts or (0,) * cluster.replicas)
        if hosts != self.hosts:
            raise StrategyError(
                f"link rates were measured on {self.signature}, the cluster is {cluster_signature(hosts)}"
            )

    @classmethod
    def uniform(
        cls,
        replicas: int,
        bandwidth: float,
        latency: float,
        hosts: Sequence[Any] | None = None,
        cross_host_bandwidth: float | None = None,
        cross_host_latency: float | None = None,
    ) -> LinkRates:
        """Every link at ``bandwidth`` / ``latency``; links between hosts at the ``cross_host_*`` rates if given.

        Example:
            >>> LinkRates.uniform(3, 1e9, 1e-5, hosts=("a", "a", "b"), cross_host_latency=1e-3).latency[0][2]
            0.001
        """
        if replicas < 1:
            raise StrategyError(f"a cluster needs at least one replica, got {replicas}")
        layout = host_layout(hosts if hosts is not None else (0,) * replicas)
        if len(layout) != replicas:
            raise StrategyError(f"hosts names {len(layout)} ranks but the cluster has {replicas} replicas")
        for name, value in (("bandwidth", bandwidth), ("cross_host_bandwidth", cross_host_bandwidth)):
            if value is not None and not value > 0:
                raise StrategyError(f"link rates: {name} must be > 0 bytes/s, got {value}")
        for name, value in (("latency", latency), ("cross_host_latency", cross_host_latency)):
            if value is not None and not value >= 0:
                raise StrategyError(f"link rates: {name} must be >= 0 s, got {value}")
        same = np.equal.outer(layout, layout)
        bw = np.where(same, bandwidth, cross_host_bandwidth if cross_host_bandwidth is not None else bandwidth)
        lat = np.where(same, latency, cross_host_latency if cross_host_latency is not None else latency)
        return cls.from_matrices(layout, bw, lat, origin="uniform")

    @classmethod
    def for_cluster(
        cls, cluster: ClusterSpec, bandwidth: float = 1e9, latency: float = 1e-4
    ) -> LinkRates:
        """Uniform rates for ``cluster``: ``bandwidth`` inside a host, ``cluster.bandwidth_gbps`` between hosts.

        Example:
            >>> r = LinkRates.for_cluster(ClusterSpec(2, hosts=(0, 1), bandwidth_gbps=1.0))
            >>> r.bandwidth[0][1]
            125000000.0
        """
        cross = cluster.bandwidth_gbps * 1e9 / 8 if cluster.bandwidth_gbps is not None else None
        return cls.uniform(cluster.replicas, bandwidth, latency, cluster.hosts, cross_host_bandwidth=cross)

    def to_json(self) -> str:
        """The rates as JSON (the calibration cache's format)."""
        return json.dumps(
            {
                "signature": self.signature,
                "hosts": list(self.hosts),
                "bandwidth": [list(row) for row in self.bandwidth],
                "latency": [list(row) for row in self.latency],
            }
        )

    @classmethod
    def from_json(cls, text: str, origin: str = "file") -> LinkRates:
        """Rates read back from :meth:`to_json`; StrategyError naming the problem if malformed."""
        try:
            obj = json.loads(text)
            return cls.from_matrices(tuple(obj["hosts"]), obj["bandwidth"], obj["latency"], origin=origin)
        except (ValueError, KeyError, TypeError) as e:
            raise StrategyError(f"link rates: malformed JSON ({type(e).__name__}: {e})") from None


def cluster_signature(hosts: Sequence[Any]) -> str:
    """``"np=N hosts=..."``: what makes two clusters the same for calibration.

    Example:
        >>> cluster_signature(["x", "y", "y"])
        'np=3 hosts=0,1,1'
    """
    layout = host_layout(hosts)
    return f"np={len(layout)} hosts={','.join(map(str, layout))}"
