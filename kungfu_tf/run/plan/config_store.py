"""``--config-store`` / ``KUNGFU_CONFIG_STORE``: where an elastic job keeps its state.

Only etcd is supported: ``etcd://HOST:PORT[,HOST:PORT...]`` names the
client endpoints of one etcd cluster (any member serves; name them all so
that the loss of any minority is survived); ``etcds://`` the same over TLS
(members whose client URLs are ``https://``; see config_store_security.py).
Without it the job's state lives in the config service embedded in one
launcher (the default).

Example:
    >>> parse_config_store("etcd://h1:2379,h2:2379,h3:2379")
    ('h1:2379', 'h2:2379', 'h3:2379')
"""

from __future__ import annotations

from kungfu_tf.run.errors import LaunchError

CONFIG_STORE_ENV = "KUNGFU_CONFIG_STORE"
SCHEME = "etcd://"
TLS_SCHEME = "etcds://"


def uses_tls(text: str) -> bool:
    """Whether a (valid) ``--config-store`` value asks for TLS.

    Example:
        >>> uses_tls("etcds://h1:2379")
        True
    """
    return text.strip().startswith(TLS_SCHEME)


def parse_config_store(text: str, source: str = "--config-store") -> tuple[str, ...]:
    """The etcd endpoints that ``text`` names.

    Raises:
        LaunchError: naming ``source`` and the value, and what is wrong:
            another scheme, no endpoint, an endpoint that is not
            HOST:PORT with a port in 1..65535, a path, or a repeated endpoint.
    """
    value = text.strip()
    bad = f"bad {source} {text!r}"
    scheme = next((s for s in (SCHEME, TLS_SCHEME) if value.startswith(s)), None)
    if scheme is None:
        got = value.split("://", 1)[0] + "://" if "://" in value else "no scheme"
        raise LaunchError(
            f"{bad}: expected etcd://HOST:PORT[,HOST:PORT...] or etcds://... for TLS (only etcd is supported), "
            f"got {got}"
        )
    rest = value[len(scheme) :]
    if "/" in rest:
        raise LaunchError(f"{bad}: no path may follow the endpoints (keys go under /kungfu/<job id>/)")
    endpoints: list[str] = []
    for i, item in enumerate(rest.split(","), start=1):
        host, sep, port = item.strip().rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host_ok = len(host) > 2
        else:
            host_ok = bool(host) and ":" not in host
        if not item.strip():
            raise LaunchError(f"{bad}: endpoint {i} is empty")
        if not sep or not host_ok or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise LaunchError(f"{bad}: endpoint {i} {item.strip()!r} is not HOST:PORT with a port in 1..65535")
        endpoint = f"{host}:{int(port)}"
        if endpoint in endpoints:
            raise LaunchError(f"{bad}: endpoint {endpoint} is named twice")
        endpoints.append(endpoint)
    return tuple(endpoints)
