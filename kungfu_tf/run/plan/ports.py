"""Port-range parsing and checks that ports on this machine are bindable."""

import errno
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from kungfu_tf.run.errors import LaunchError

DEFAULT_PORT_RANGE = "10000-11000"


@dataclass(frozen=True)
class PortRange:
    """An inclusive ``first-last`` range of TCP ports."""

    first: int
    last: int


def parse_port_range(text: str) -> PortRange:
    """Parse ``"A-B"`` with ``1 <= A <= B <= 65535``.

    Raises:
        LaunchError: if the text is malformed or out of bounds.
    """
    first_text, sep, last_text = text.strip().partition("-")
    try:
        if not sep:
            raise ValueError
        first, last = int(first_text), int(last_text)
    except ValueError:
        raise LaunchError(
            f"bad --port-range {text!r}: expected A-B, e.g. 10000-11000"
        ) from None
    if not 1 <= first <= last <= 65535:
        raise LaunchError(f"bad --port-range {text!r}: need 1 <= A <= B <= 65535")
    return PortRange(first, last)


def find_free_ports(host: str, count: int) -> list[int]:
    """Let the kernel pick ``count`` distinct currently-free ports on ``host``.

    All probe sockets stay bound until every port is chosen so the kernel
    cannot hand out the same port twice.  Ports from ``bind(port=0)`` do
    not clash with outgoing connections on Linux >= 4.6, which takes
    connect() source ports from the other parity.  A concurrent process
    could still grab a port before the worker binds it; that window is
    the price of not needing a coordinator.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(_family(host), socket.SOCK_STREAM)
            sockets.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    except OSError as e:
        raise LaunchError(f"cannot bind a port on {host}: {e.strerror}") from None
    finally:
        for s in sockets:
            s.close()


def check_ports_free(host: str, ports: Iterable[int]) -> None:
    """Fail early, naming the port, if a worker could not bind its port.

    SO_REUSEADDR is set so that ports merely in TIME_WAIT from a previous
    job are not reported, matching what a listening worker can bind.

    Raises:
        LaunchError: if some port is in use or ``host`` is not local.
    """
    for port in ports:
        with socket.socket(_family(host), socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise LaunchError(
                        f"port {port} on {host} is already in use; "
                        "choose another --port-range"
                    ) from None
                raise LaunchError(
                    f"cannot bind port {port} on {host}: {e.strerror}"
                ) from None


def _family(host: str) -> socket.AddressFamily:
    """Address family of ``host`` (hostnames may resolve to IPv6 only)."""
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise LaunchError(f"cannot resolve host {host!r}: {e.strerror}") from None
