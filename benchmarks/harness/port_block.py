"""A ``--port-range`` for ``kungfu-run`` in tests and benchmarks: ports free now, and outside the ephemeral range.

The kernel takes the source port of every outgoing connection (an etcd
client's, a gRPC channel's, a worker's link) from its ephemeral range
(Linux: 32768-60999). A range given to ``kungfu-run`` inside it can be
taken by such a connection between the pick and the launcher's check: that
launcher then refuses to start (``port P on H is already in use``) and the
job's other launchers wait for its members. Below the ephemeral range only
explicit binds take ports, so a block found free there stays free.

Example:
    >>> first = free_port_block(41, hosts=("127.0.0.1", "127.0.0.2"))
    >>> f"--port-range={first}-{first + 40}"  # doctest: +SKIP
"""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# The lowest port a block starts at: clear of the well-known and most registered services' ports.
LOWEST_PORT = 20000
ATTEMPTS = 200


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        first, last = (int(x) for x in EPHEMERAL_RANGE_FILE.read_text().split())
        return first, last
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    # As kungfu-run checks a port (run/plan/ports.py): SO_REUSEADDR, so TIME_WAIT leftovers do not count.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(size: int, hosts: Sequence[str] = ("127.0.0.1",)) -> int:
    """The first port of ``size`` consecutive ports, each bindable now on every one of ``hosts`` (IPv4 addresses),
    all below the ephemeral range (anywhere free if that range leaves no room below it).

    Raises:
        RuntimeError: no such block in ``ATTEMPTS`` random tries.
    """
    low, high = LOWEST_PORT, ephemeral_range()[0] - size
    if high <= low:  # an ephemeral range that starts low: any free block will do
        low, high = 1024, 65536 - size
    pick = random.Random()  # seeded from os.urandom: parallel runs pick apart
    for _ in range(ATTEMPTS):
        first = pick.randrange(low, high)
        if all(_bindable(h, p) for p in range(first, first + size) for h in hosts):
            return first
    raise RuntimeError(f"no {size} consecutive free ports on {', '.join(hosts)} in {ATTEMPTS} tries")
