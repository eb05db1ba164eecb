"""Throwaway TLS certificates for etcd members on 127.0.0.1, made with the ``openssl`` CLI.

``make_certificates(d)`` writes into the new directory ``d``: ``ca.crt``
(with ``ca.key``), which signs ``server.crt`` (for IP 127.0.0.1) and
``client.crt`` (a client certificate, for etcd's ``--client-cert-auth``),
each with its ``.key``; and ``wrongca.crt``, a second CA that signs nothing
here (a wrong ``--config-store-ca``). EC P-256 keys: made in milliseconds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(d: Path) -> Path:
    """The directory ``d`` with the certificates above (valid for 2 days)."""
    d.mkdir(parents=True)
    for ca in ("ca", "wrongca"):
        _openssl("req", "-x509", *_EC, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2", "-subj", f"/CN={ca}", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *_EC, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d,
        )  # fmt: skip
    return d
