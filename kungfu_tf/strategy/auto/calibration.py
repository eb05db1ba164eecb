"""Measuring the running cluster's links for the cost model, once per cluster, cached.

``calibrate()`` is collective: every worker of the job calls it, and every
worker returns the same :class:`LinkRates`. The probe uses the runtime's
model store (``ops.save`` / ``ops.request``): every worker saves a small and
a large blob, then in rounds k = 1 .. np-1 every rank r fetches both from
rank (r + k) mod np, so each round is a permutation (every rank sends to one
peer and receives from one, as a pair would in isolation), and a barrier
separates the rounds. The best of ``repeats`` fetches of the small blob is
the pair's latency (a whole request: the message there and back, dispatch
included, which is what one more message of a strategy costs); the large
blob's size over its best time gives the bandwidth (latency included: on a
loaded machine the two are measured at different moments, and subtracting
one from the other can leave nothing). Every worker's row
of measurements is then all-gathered, so all hold the same matrices.

Results are cached in a JSON file per cluster (the host names of the ranks,
in order) under ``cache_dir`` (default ``$KUNGFU_TF_CACHE_DIR`` or
``~/.cache/kungfu_tf``). Whether to use the cache is rank 0's decision,
broadcast with rank 0's cached numbers, so workers whose caches differ still
agree (and none probes alone while the others wait).

A cluster that cannot be calibrated (one worker: no links; a peer that dies
or never answers) raises StrategyError on every worker that calls it.

Example:
    >>> from kungfu_tf.strategy.auto.calibration import calibrate
    >>> calibrate()  # outside kungfu-run: a one-worker cluster
    Traceback (most recent call last):
    ...
    kungfu_tf.strategy.errors.StrategyError: cannot calibrate the links of a one-worker cluster: there are no links to measure (start the job with kungfu-run -np 2 or more, or use LinkRates.uniform)
"""

from __future__ import annotations

import hashlib
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kungfu_tf.strategy.auto.link_rates import LinkRates, cluster_signature
from kungfu_tf.strategy.errors import StrategyError

__all__ = ["LinkRates", "cache_path", "calibrate", "default_cache_dir", "measure_compute_time", "usable_cores"]

DEFAULT_PROBE_BYTES = 4 * 1024 * 1024
DEFAULT_REPEATS = 5
_CACHE_ENV = "KUNGFU_TF_CACHE_DIR"
# The smallest time a fetch of the large blob may count for (a clock that did not advance).
_MIN_TRANSFER_S = 1e-6


def default_cache_dir() -> Path:
    """``$KUNGFU_TF_CACHE_DIR``, else ``~/.cache/kungfu_tf``.

    Example:
        >>> default_cache_dir().name in ("kungfu_tf", os.environ.get("KUNGFU_TF_CACHE_DIR", "kungfu_tf").rsplit("/", 1)[-1])
        True
    """
    configured = os.environ.get(_CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "kungfu_tf"


def cache_path(host_names: Sequence[str], cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache file of the cluster whose rank r runs on ``host_names[r]``.

    Example:
        >>> cache_path(["a", "a", "b"], "/tmp/c").name
        'link_rates-np3-12d3a5d15ab2a70c.json'
    """
    key = hashlib.sha256(",".join(host_names).encode()).hexdigest()[:16]
    return Path(cache_dir if cache_dir is not None else default_cache_dir()) / f"link_rates-np{len(host_names)}-{key}.json"


def _host_names(size: int) -> list[str]:
    """Each rank's host, from the launcher's peer list; all one host when the list does not match the job."""
    peers = [p for p in os.environ.get("KUNGFU_PEERS", "").split(",") if p]
    if len(peers) != size:
        return ["localhost"] * size
    return [p.rsplit(":", 1)[0] for p in peers]


def _read_cache(path: Path, signature: str) -> LinkRates | None:
    try:
        rates = LinkRates.from_json(path.read_text(), origin="cache")
    except (OSError, StrategyError):
        return None
    return rates if rates.signature == signature else None


def _write_cache(path: Path, rates: LinkRates) -> None:
    # Workers on one host share the file: write a private temporary file and
    # rename it over the old one, so a reader sees one whole version or the other.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(rates.to_json())
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written only costs the next job a probe


def _encode(rates: LinkRates | None, n: int) -> np.ndarray:
    """[1 + 2 n n] float64: a found flag, then bandwidth and latency (what rank 0 broadcasts)."""
    if rates is None:
        return np.zeros(1 + 2 * n * n)
    return np.concatenate([[1.0], np.ravel(rates.bandwidth), np.ravel(rates.latency)])


def _probe(rank: int, size: int, probe_bytes: int, repeats: int, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """This rank's row: bandwidth and latency of the link from every peer to it."""
    import tensorflow as tf

    from kungfu_tf import ops

    small = tf.zeros([1], tf.float32)
    large = tf.zeros([max(1, probe_bytes // 4)], tf.float32)
    ops.save(f"{tag}/small", small)
    ops.save(f"{tag}/large", large)
    ops.barrier(name=f"{tag}/saved")
    bandwidth = np.zeros(size)
    latency = np.zeros(size)
    for k in range(1, size):
        peer = (rank + k) % size

        def best(name: str, like: tf.Tensor, peer: int = peer) -> float:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                ops.request(peer, name, like=like).numpy()
                times.append(time.perf_counter() - start)
            return min(times)

        latency[peer] = best(f"{tag}/small", small)
        moved = best(f"{tag}/large", large)
        # The whole fetch, latency included: subtracting a latency measured on a loaded machine can
        # leave nothing (or less than nothing) of a fetch that took milliseconds.
        bandwidth[peer] = large.shape[0] * 4 / max(moved, _MIN_TRANSFER_S)
        ops.barrier(name=f"{tag}/round{k}")
    return bandwidth, latency


def calibrate(
    cache_dir: str | os.PathLike[str] | None = None,
    refresh: bool = False,
    probe_bytes: int = DEFAULT_PROBE_BYTES,
    repeats: int = DEFAULT_REPEATS,
) -> LinkRates:
    """The running job's link rates, measured or read from the cache; the same on every worker.

    Collective: every worker must call it. ``refresh`` measures again even
    when the cache has the cluster. The result's ``origin`` is "probe" or
    "cache".

    Raises:
        StrategyError: one worker (nothing to measure), or the probe failed
            (the message names the rank and the runtime's error).
    """
    if probe_bytes < 4:
        raise ValueError(f"probe_bytes must be >= 4, got {probe_bytes}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    import tensorflow as tf

    from kungfu_tf import ops

    size = int(ops.cluster_size())
    if size < 2:
        raise StrategyError(
            "cannot calibrate the links of a one-worker cluster: there are no links to measure"
            " (start the job with kungfu-run -np 2 or more, or use LinkRates.uniform)"
        )
    rank = int(ops.rank())
    hosts = _host_names(size)
    signature = cluster_signature(hosts)
    path = cache_path(hosts, cache_dir)
    tag = f"kungfu_calibrate_v{int(ops.cluster_version())}"
    try:
        mine = None if refresh or rank != 0 else _read_cache(path, signature)
        decided = ops.broadcast(tf.constant(_encode(mine, size)), root=0, name=f"{tag}/cache").numpy()
        if decided[0] == 1.0:
            n2 = size * size
            rates = LinkRates.from_matrices(
                hosts,
                decided[1 : 1 + n2].reshape(size, size),
                decided[1 + n2 :].reshape(size, size),
                origin="cache",
            )
        else:
            bandwidth_row, latency_row = _probe(rank, size, probe_bytes, repeats, tag)
            # Row r of a gathered matrix is what rank r received: entry [r, j] is the link j -> r.
            bw_in = ops.all_gather(tf.constant(bandwidth_row), name=f"{tag}/bandwidth").numpy()
            lat_in = ops.all_gather(tf.constant(latency_row), name=f"{tag}/latency").numpy()
            rates = LinkRates.from_matrices(hosts, bw_in.T, lat_in.T, origin="probe")
            _write_cache(path, rates)
    except tf.errors.OpError as e:
        # TF prefixes eager errors with the op's internal function name, which tells a user nothing.
        message = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", e.message)
        raise StrategyError(f"link calibration failed on rank {rank} of {size}: {message}") from None
    return rates


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity): ``CostModel(cores_per_host=...)`` for hosts like this one.

    Example:
        >>> usable_cores() >= 1
        True
    """
    return len(os.sched_getaffinity(0))


def measure_compute_time(
    step_fn: Callable[[], Any], steps: int = 5, warmup: int = 1, agree: bool = True
) -> float:
    """Median seconds of one call of ``step_fn`` (a local training step, without synchronisation).

    ``warmup`` calls first (tracing, allocation) are not timed. With
    ``agree`` and more than one worker, every worker returns the largest
    median (the slowest worker sets the pace), so all hold the same number;
    every worker must then call it.

    Example:
        >>> measure_compute_time(lambda: sum(range(1000)), steps=3) >= 0
        True
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    for _ in range(warmup):
        step_fn()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step_fn()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    if not agree:
        return median
    import tensorflow as tf

    from kungfu_tf import ops

    if int(ops.cluster_size()) < 2:
        return median
    return float(ops.all_reduce(tf.constant(median, tf.float64), op="max", name="kungfu_compute_time").numpy())
