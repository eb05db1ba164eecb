"""Two emulated hosts for benchmarks: network namespaces joined by a rate-limited veth link.

Same-host peers talk over their namespace's own loopback, so only inter-host
traffic meets the ``tc`` token-bucket limit: what a cluster of multi-GPU
machines on a slow network looks like. Needs root (``ip netns``); without it
:func:`make_limited_hosts` says why instead of raising, so a benchmark can
report the setting as skipped.

Example:
    >>> hosts, why = make_limited_hosts("10.217.0", "kfs", rate="1gbit")  # doctest: +SKIP
    >>> argvs = two_host_commands(hosts, 4, ["python", "worker.py"])      # doctest: +SKIP
    >>> envs = [two_host_env()] * 2                                        # doctest: +SKIP
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Sequence

from benchmarks.harness.netns import (
    NamespaceCommandFailed,
    NamespacesUnavailable,
    TwoHosts,
    create_two_hosts,
)
from benchmarks.harness.proc import worker_env

__all__ = ["TwoHosts", "make_limited_hosts", "set_link_rate", "two_host_commands", "two_host_env"]

# The token bucket's defaults: about 1 ms at 1 Gbit/s (at least the 64 KiB of a TSO segment), and how long tbf
# queues before it drops.
BURST, LATENCY = "256kb", "50ms"


def make_limited_hosts(
    subnet: str, tag: str, rate: str, burst: str = BURST, latency: str = LATENCY
) -> tuple[TwoHosts | None, str | None]:
    """The two hosts (``<subnet>.1`` and ``.2``) with ``rate`` on both ends of the link, or (None, why not)."""
    try:
        hosts = create_two_hosts(subnet, tag)
    except (NamespacesUnavailable, NamespaceCommandFailed) as e:
        return None, str(e)
    try:
        hosts.limit_bandwidth(rate=rate, burst=burst, latency=latency)
    except BaseException:
        hosts.destroy()
        raise
    return hosts, None


def set_link_rate(hosts: TwoHosts, rate: str, burst: str = BURST, latency: str = LATENCY) -> None:
    """Changes the link's rate on both ends while jobs run over it (``tc qdisc replace``: a throttled link).

    Raises:
        RuntimeError: ``tc`` refused (its message and the command included).
    """
    for ns, dev in zip(hosts.namespaces, hosts.devices):
        cmd = ["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", burst]
        cmd += ["latency", latency]
        done = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def two_host_commands(
    hosts: TwoHosts,
    np: int,
    worker_argv: Sequence[str],
    launcher_options: Sequence[str] = (),
) -> list[list[str]]:
    """One ``kungfu-run`` per host, ``np // 2`` workers each (``-H A:n,B:n``), run inside its namespace."""
    if np < 2 or np % 2:
        raise ValueError(
            f"np must be even and at least 2 (half the workers on each host), got {np}"
        )
    a, b = hosts.addresses
    launcher = [
        sys.executable,
        "-m",
        "kungfu_tf.run",
        "-np",
        str(np),
        *launcher_options,
    ]
    launcher += ["-H", f"{a}:{np // 2},{b}:{np // 2}"]
    return [
        hosts.exec_prefix(0) + launcher + list(worker_argv),
        hosts.exec_prefix(1) + launcher + ["--self", b] + list(worker_argv),
    ]


def two_host_env() -> dict[str, str]:
    """The workers' environment, with a fresh job secret and job id that both launchers must share."""
    return worker_env(
        {
            "KUNGFU_JOB_SECRET": secrets.token_hex(32),
            "KUNGFU_JOB_ID": secrets.token_hex(16),
        }
    )
