"""Two emulated "hosts": Linux network namespaces joined by a veth pair.

``create_two_hosts("10.213.0", "kfl")`` creates namespaces
``kfl<pid>a`` and ``kfl<pid>b`` whose ends of a veth pair carry
``10.213.0.1/24`` and ``10.213.0.2/24``; the pair is created inside the first
namespace and its peer moved straight into the second, so nothing appears in
the root namespace and no traffic leaves the two. Loopback is brought up in
both (the runtime's same-host abstract Unix sockets are per namespace).
``destroy`` kills whatever still runs in the namespaces (only what the caller
started there can) and deletes them (which also destroys the veth pair).

The benchmarks (``hosts.py``) and the multi-host tests (``tests/netns.py``,
which turns a refusal into a skip or a failure) share it.

Example:
    >>> hosts = create_two_hosts("10.213.0", "kfl")  # doctest: +SKIP
    >>> hosts.exec_prefix(1) + ["hostname", "-I"]     # doctest: +SKIP
    ['ip', 'netns', 'exec', 'kfl1234b', 'hostname', '-I']
    >>> hosts.destroy()                               # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

__all__ = ["NamespaceCommandFailed", "NamespacesUnavailable", "TwoHosts", "create_two_hosts"]


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=False, capture_output=True, text=True)


def ip_ok(*args: str) -> None:
    res = ip(*args)
    if res.returncode != 0:
        raise NamespaceCommandFailed(f"ip {' '.join(args)}: {res.stderr.strip()}")


@dataclass(frozen=True)
class TwoHosts:
    namespaces: tuple[str, str]
    addresses: tuple[str, str]
    devices: tuple[str, str] = ("veth0", "veth1")

    def exec_prefix(self, i: int) -> list[str]:
        """Command prefix that runs a program inside host ``i``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def limit_bandwidth(self, rate: str, burst: str, latency: str) -> None:
        """A token-bucket filter on both ends of the veth pair."""
        if not shutil.which("tc"):
            raise NamespaceCommandFailed("the `tc` command (apt package iproute2) is required")
        for ns, dev in zip(self.namespaces, self.devices):
            cmd = ["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf"]
            cmd += ["rate", rate, "burst", burst, "latency", latency]
            res = subprocess.run(cmd, check=False, capture_output=True, text=True)
            if res.returncode != 0:
                raise NamespaceCommandFailed(f"{' '.join(cmd)}: {res.stderr.strip()}")

    def qdisc_stats(self, i: int) -> dict:
        """Root qdisc of host ``i``'s end of the pair (``tc -s -j qdisc show``)."""
        cmd = ["tc", "-n", self.namespaces[i], "-s", "-j", "qdisc", "show", "dev", self.devices[i]]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return next(q for q in json.loads(out) if q.get("root"))

    def link_stats(self, i: int) -> dict:
        """Byte and packet counters of host ``i``'s end of the pair."""
        cmd = ["ip", "-n", self.namespaces[i], "-s", "-j", "link", "show", "dev", self.devices[i]]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        return json.loads(out)[0]["stats64"]

    def kill_all(self) -> None:
        """SIGKILL every process still running in either namespace."""
        for ns in self.namespaces:
            for pid in ip("netns", "pids", ns).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)

    def destroy(self) -> None:
        """Kills what runs in the namespaces and deletes them (and so the veth pair).

        Safe to call on partly created hosts: missing namespaces are skipped.
        """
        self.kill_all()
        existing = set(ip("netns", "list").stdout.split())
        for ns in self.namespaces:
            if ns in existing:
                ip("netns", "delete", ns)


class NamespaceCommandFailed(RuntimeError):
    """An ``ip`` or ``tc`` command failed (its command line and message included)."""


class NamespacesUnavailable(RuntimeError):
    """This process may not create network namespaces (no privileges)."""


def create_two_hosts(prefix: str, tag: str) -> TwoHosts:
    """Namespaces ``<tag><pid>a/b`` with ``<prefix>.1`` and ``<prefix>.2``.

    ``prefix`` is the first three octets of a /24 that nothing else uses;
    ``tag`` keeps the namespace names of different users apart. On any
    failure whatever was created is destroyed again before the error
    propagates.

    Raises:
        NamespacesUnavailable: ``ip netns add`` was refused for privileges.
        NamespaceCommandFailed: any other ``ip`` command failed (its message included).
    """
    if not shutil.which("ip"):
        raise NamespaceCommandFailed("the `ip` command (apt package iproute2) is required")
    base = f"{tag}{os.getpid()}"
    hosts = TwoHosts(namespaces=(f"{base}a", f"{base}b"), addresses=(f"{prefix}.1", f"{prefix}.2"))
    first = ip("netns", "add", hosts.namespaces[0])
    if first.returncode != 0:
        reason = first.stderr.strip()
        if "Operation not permitted" in reason or "Permission denied" in reason:
            raise NamespacesUnavailable(f"cannot create network namespaces: {reason}")
        raise NamespaceCommandFailed(f"ip netns add failed: {reason}")
    try:
        ip_ok("netns", "add", hosts.namespaces[1])
        dev_a, dev_b = hosts.devices
        ns_a, ns_b = hosts.namespaces
        ip_ok("-n", ns_a, "link", "add", dev_a, "type", "veth", "peer", "name", dev_b, "netns", ns_b)
        for ns, dev, addr in zip(hosts.namespaces, hosts.devices, hosts.addresses):
            ip_ok("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            ip_ok("-n", ns, "link", "set", dev, "up")
            ip_ok("-n", ns, "link", "set", "lo", "up")
    except BaseException:
        hosts.destroy()
        raise
    return hosts
