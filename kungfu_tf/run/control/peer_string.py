"""Worker addresses as "host:port" strings, the form Python code and the runtime use.

The config service stores a worker as a ``PeerID`` message (host, port); the
runtime, the ``KUNGFU_*`` variables and the elastic code name it
``"host:port"``. An IPv6 literal is written in brackets (``"[::1]:10000"``),
so the port is always what follows the last colon.

Example:
    >>> from kungfu_tf.run.control.peer_string import parse_peer_string, peer_string
    >>> peer_string(parse_peer_string("[::1]:10000"))
    '[::1]:10000'
    >>> parse_peer_string("10.0.0.1:10001").port
    10001
"""

from __future__ import annotations

import re

from kungfu_tf.proto import config_pb2

__all__ = ["cluster_peers", "parse_peer_string", "peer_problem", "peer_string"]

_PORT = re.compile(r"[0-9]{1,5}")


def peer_string(peer: config_pb2.PeerID) -> str:
    """``peer`` as "host:port"; an IPv6 host (one with a colon) in brackets."""
    host = f"[{peer.host}]" if ":" in peer.host else peer.host
    return f"{host}:{peer.port}"


def parse_peer_string(text: str) -> config_pb2.PeerID:
    """The PeerID of "host:port" (IPv6 as "[addr]:port").

    Raises:
        ValueError: naming ``text`` if it is not host:port with a non-empty
            host and a port in 1..65535.
    """
    if not isinstance(text, str):
        raise TypeError(f"peer must be a 'host:port' string, got {type(text).__name__} {text!r}")
    host, colon, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        bracketed_ok = ":" in host
    else:
        bracketed_ok = ":" not in host and "[" not in host and "]" not in host
    if not (colon and host and bracketed_ok and _PORT.fullmatch(port) and 1 <= int(port) <= 65535):
        raise ValueError(
            f"bad peer address {text!r}: expected host:port with a non-empty host "
            "(IPv6 in brackets, e.g. [::1]:10000) and a port in 1..65535"
        )
    return config_pb2.PeerID(host=host, port=int(port))


def peer_problem(peer: config_pb2.PeerID) -> str | None:
    """Why ``peer`` cannot be a worker's address, or None if it can."""
    if not peer.host:
        return "has an empty host"
    if not 1 <= peer.port <= 65535:
        return f"({peer.host}) has invalid port {peer.port} (want 1..65535)"
    return None


def cluster_peers(cluster: config_pb2.Cluster) -> list[str]:
    """The workers of ``cluster`` as "host:port" strings, in rank order."""
    return [peer_string(w) for w in cluster.workers]
