"""Deciding which ``-H`` host is the machine this launcher runs on."""

import socket
from collections.abc import Sequence

from kungfu_tf.run.errors import LaunchError


def is_local_address(host: str) -> bool:
    """True if ``host`` resolves to an address assigned to this machine.

    Binding a UDP socket succeeds only for local addresses, which is a
    portable test that needs no interface enumeration (it does report
    every address as local if net.ipv4.ip_nonlocal_bind is enabled).
    """
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_DGRAM)
    except socket.gaierror:
        return False
    for family, _type, _proto, _name, sockaddr in infos:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            try:
                s.bind(sockaddr)
            except OSError:
                continue
            return True
    return False


def choose_self_host(hosts: Sequence[str], requested: str | None) -> str:
    """Return the host whose workers this launcher starts.

    Args:
        hosts: the ``-H`` hosts in list order.
        requested: the ``--self`` value, or None to auto-detect.

    Raises:
        LaunchError: if ``requested`` is not in ``hosts``, or nothing was
            requested and no host is a local address.
    """
    if requested is not None:
        if requested not in hosts:
            raise LaunchError(
                f"--self {requested} is not one of the hosts: {', '.join(hosts)}"
            )
        return requested
    for host in hosts:
        if is_local_address(host):
            return host
    raise LaunchError(
        f"none of the hosts ({', '.join(hosts)}) is an address of this "
        "machine; pass --self HOST to say which one this is"
    )
