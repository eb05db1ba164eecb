"""Pure functions mapping a ``-H host:slots,...`` list to ranked peers.

Every launcher of a multi-host job evaluates these functions on the same
arguments and must obtain the same peer list without talking to the other
launchers, so nothing here may depend on the machine it runs on.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from kungfu_tf.run.errors import LaunchError

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class HostSlots:
    """One ``host:slots`` entry of the ``-H`` option."""

    host: str
    slots: int


@dataclass(frozen=True)
class Placement:
    """Where a rank runs: its host and its index among that host's workers."""

    rank: int
    host: str
    local_index: int


@dataclass(frozen=True)
class Peer:
    """A worker as the runtime sees it: rank plus ``host:port`` address."""

    rank: int
    host: str
    port: int

    @property
    def address(self) -> str:
        """The ``host:port`` string used in ``KUNGFU_SELF``/``KUNGFU_PEERS``."""
        return f"{self.host}:{self.port}"


def parse_hosts(spec: str) -> list[HostSlots]:
    """Parse ``"host:slots,host:slots,..."`` preserving the given order.

    Raises:
        LaunchError: on empty entries, missing or non-positive slot counts,
            hosts containing ``:`` (IPv6 literals would make ``host:port``
            ambiguous) or a host listed twice.
    """
    if not spec.strip():
        raise LaunchError("-H must not be empty; expected host:slots[,host:slots...]")
    hosts: list[HostSlots] = []
    seen: set[str] = set()
    for raw in spec.split(","):
        entry = raw.strip()
        host, sep, slots_text = entry.rpartition(":")
        if not sep or not host or not slots_text:
            raise LaunchError(f"bad -H entry {entry!r}: expected host:slots")
        if ":" in host or any(c.isspace() for c in host):
            raise LaunchError(
                f"bad -H entry {entry!r}: host must be a hostname or IPv4 address"
            )
        try:
            slots = int(slots_text)
        except ValueError:
            raise LaunchError(
                f"bad -H entry {entry!r}: slots must be an integer"
            ) from None
        if slots < 1:
            raise LaunchError(f"bad -H entry {entry!r}: slots must be at least 1")
        if host in seen:
            raise LaunchError(f"bad -H list: host {host!r} is listed twice")
        seen.add(host)
        hosts.append(HostSlots(host, slots))
    return hosts


def place_workers(hosts: Sequence[HostSlots], np: int) -> list[Placement]:
    """Fill the hosts' slots in list order; rank order is that fill order.

    Raises:
        LaunchError: if ``np`` is not positive or exceeds the total slots.
    """
    if np < 1:
        raise LaunchError(f"-np must be at least 1, got {np}")
    total = sum(h.slots for h in hosts)
    if np > total:
        listing = ",".join(f"{h.host}:{h.slots}" for h in hosts)
        raise LaunchError(
            f"-np {np} exceeds the {total} slots available in -H {listing}"
        )
    placements: list[Placement] = []
    for h in hosts:
        for local_index in range(h.slots):
            if len(placements) == np:
                return placements
            placements.append(Placement(len(placements), h.host, local_index))
    return placements


def hosts_in_use(placements: Sequence[Placement]) -> list[str]:
    """Distinct hosts that run at least one worker, in rank order."""
    return list(dict.fromkeys(p.host for p in placements))


def assign_range_ports(
    placements: Sequence[Placement], first_port: int, last_port: int
) -> list[Peer]:
    """Give worker ``j`` of every host port ``first_port + j``.

    This depends only on the arguments, which is what lets every host's
    launcher derive the identical peer list.

    Raises:
        LaunchError: if some host needs more ports than the range holds.
    """
    peers: list[Peer] = []
    for p in placements:
        port = first_port + p.local_index
        if port > last_port:
            raise LaunchError(
                f"port range {first_port}-{last_port} is too small: host "
                f"{p.host} runs more than {last_port - first_port + 1} workers"
            )
        peers.append(Peer(p.rank, p.host, port))
    return peers
