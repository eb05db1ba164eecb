"""Where the next joiner of an elastic job runs: a free slot and a fresh port.

Only the launcher that serves the config service places joiners (so two
launchers never pick the same slot); the placement travels to the host's own
launcher inside AddJoiner (the joiner's ``host:port``), and that launcher
starts it.

Example:
    >>> placer = JoinerPlacer(PortRange(10000, 10009), local_host="10.0.0.1")
    >>> placer.note_used("10.0.0.2", 10000)
    >>> placer.place([HostSlots("10.0.0.1", 1), HostSlots("10.0.0.2", 2)], {"10.0.0.1": 1, "10.0.0.2": 1})
    ('10.0.0.2', 10001)
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.ports import PortRange, find_free_ports
from kungfu_tf.run.worker_env.placement import HostSlots


class NoPortLeft(LaunchError):
    """Every port of the range was used on that host during this job."""


class JoinerPlacer:
    """Fills the hosts' slots in list order, like ``-H``; ports are never reused.

    A port that a worker of this job used (even one that died) is not handed
    out again: its peers may still hold a half-closed connection to it, and a
    new process at the same ``host:port`` would look like the old member.

    ``port_range`` None means one host and kernel-chosen free ports (as for
    the initial workers of a single-host job); with a range, the lowest
    port not used yet is taken, and on this launcher's own host also one
    that can be bound now.
    """

    def __init__(self, port_range: PortRange | None, local_host: str):
        """Place ports from ``port_range`` (or free ports); ``local_host`` is this launcher's host."""
        self._range = port_range
        self._local_host = local_host
        self._used: dict[str, set[int]] = {}

    def note_used(self, host: str, port: int) -> None:
        """Remember that ``host:port`` belongs (or belonged) to a worker of this job."""
        self._used.setdefault(host, set()).add(port)

    def free_slot_host(self, hosts: Sequence[HostSlots], occupied: Mapping[str, int]) -> str | None:
        """The first host with fewer workers (``occupied``) than slots, or None."""
        for h in hosts:
            if occupied.get(h.host, 0) < h.slots:
                return h.host
        return None

    def place(self, hosts: Sequence[HostSlots], occupied: Mapping[str, int]) -> tuple[str, int] | None:
        """``(host, port)`` for one joiner, remembered as used; None if no slot is free.

        Raises:
            NoPortLeft: the host with a free slot has used up its port range.
        """
        host = self.free_slot_host(hosts, occupied)
        if host is None:
            return None
        port = self._port_on(host)
        self.note_used(host, port)
        return host, port

    def _port_on(self, host: str) -> int:
        used = self._used.get(host, set())
        if self._range is None:
            # A handful of tries: the kernel rarely repeats a recent port.
            for _ in range(16):
                (port,) = find_free_ports(host, 1)
                if port not in used:
                    return port
            raise NoPortLeft(f"no free port on {host} that no worker of this job used")
        for port in range(self._range.first, self._range.last + 1):
            if port not in used and (host != self._local_host or _bindable(host, port)):
                return port
        raise NoPortLeft(
            f"every port of --port-range {self._range.first}-{self._range.last} on {host} "
            "was used by a worker of this job; give a larger --port-range"
        )


def _bindable(host: str, port: int) -> bool:
    """True if a worker could listen on ``host:port`` now (TIME_WAIT does not count)."""
    try:
        family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        return True
    except OSError:
        return False
