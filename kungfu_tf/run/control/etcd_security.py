"""How a client proves itself to etcd and checks etcd's members: TLS and user/password.

Both are optional, as in etcd itself: a cluster started with ``https://``
client URLs needs TLS (and, with ``--client-cert-auth``, a client
certificate); one with authentication enabled needs a user and password.
The values are the contents, not paths: the launcher reads the files while
checking its options, so a missing or unreadable file is named there, by
its option, before anything connects.

Example::

    security = EtcdSecurity(tls=True, ca=open("ca.crt", "rb").read(), user="root",
                            password="...", password_source="KUNGFU_CONFIG_STORE_PASSWORD")
    client = EtcdClient(["h1:2379"], security=security)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EtcdSecurity:
    """TLS material and credentials for an :class:`~kungfu_tf.run.control.etcd_client.EtcdClient`.

    ``tls``: connect with TLS; ``ca``: PEM certificates that verify the
    members (None: the system's trusted roots); ``cert``/``key``: this
    client's PEM certificate and key (for etcd's ``--client-cert-auth``);
    ``user``/``password``: etcd credentials (Auth.Authenticate); the
    ``*_source`` fields name where each came from, for error messages.

    Example:
        >>> EtcdSecurity(user="root", password="pw").authenticates
        True
    """

    tls: bool = False
    ca: bytes | None = field(default=None, repr=False)
    cert: bytes | None = field(default=None, repr=False)
    key: bytes | None = field(default=None, repr=False)
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_source: str = "the system's trusted CAs"
    password_source: str = "the password"

    @property
    def authenticates(self) -> bool:
        """Whether calls carry a token obtained with ``user`` and ``password``."""
        return self.user is not None
