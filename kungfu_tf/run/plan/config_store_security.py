"""TLS and authentication options of ``--config-store``: files and credentials -> EtcdSecurity.

The names follow etcdctl's (``--cacert``, ``--cert``, ``--key``,
``--user``), prefixed as the other store options are, each with a
``KUNGFU_CONFIG_STORE_*`` variable beside it (the option wins)::

    --config-store etcds://h1:2379,...     TLS (the members' client URLs are https://)
    --config-store-ca FILE                 PEM CA that signed the members' certificates
                                           (default: the system's trusted CAs)
    --config-store-cert FILE, -key FILE    this launcher's certificate and key, for
                                           etcd's --client-cert-auth
    --config-store-user NAME               etcd user (authentication enabled on etcd)
    KUNGFU_CONFIG_STORE_PASSWORD           its password, or
    --config-store-password-file FILE      a file holding it (first line)

The password is never an option: a command line is readable by every user
of the host (``ps``, ``/proc/PID/cmdline``) and lands in shell histories and
job scripts; a variable or a file with restricted permissions does not.

Example:
    >>> resolve_store_security(tls=False, options={}, environ={}) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kungfu_tf.run.control.etcd_security import EtcdSecurity
from kungfu_tf.run.errors import LaunchError

# option name -> the variable read when the option is not given
STORE_SECURITY_ENV = {
    "--config-store-ca": "KUNGFU_CONFIG_STORE_CA",
    "--config-store-cert": "KUNGFU_CONFIG_STORE_CERT",
    "--config-store-key": "KUNGFU_CONFIG_STORE_KEY",
    "--config-store-user": "KUNGFU_CONFIG_STORE_USER",
    "--config-store-password-file": "KUNGFU_CONFIG_STORE_PASSWORD_FILE",
}
PASSWORD_ENV = "KUNGFU_CONFIG_STORE_PASSWORD"
_TLS_OPTIONS = ("--config-store-ca", "--config-store-cert", "--config-store-key")


def resolve_store_security(
    *, tls: bool, options: Mapping[str, str | Path | None], environ: Mapping[str, str]
) -> EtcdSecurity | None:
    """The TLS material and credentials that ``options`` (option name -> value or None)
    and ``environ`` give; None when neither TLS nor a user is asked for.

    Raises:
        LaunchError: naming the option (or variable) and the cause: a file that
            cannot be read or holds no PEM certificate/key, TLS files without
            ``etcds://``, a certificate without its key (or the reverse), a user
            without a password or a password without a user, or an empty one.
    """
    given: dict[str, tuple[str, str]] = {}  # option -> (value, where it came from)
    for option, variable in STORE_SECURITY_ENV.items():
        value = options.get(option)
        if value is not None:
            given[option] = (str(value), f"{option} {value}")
        elif environ.get(variable, "").strip():
            given[option] = (environ[variable].strip(), f"{variable}={environ[variable].strip()}")
    for option in _TLS_OPTIONS:
        if option in given and not tls:
            raise LaunchError(f"{given[option][1]} needs TLS: name the members as etcds://HOST:PORT,...")
    if ("--config-store-cert" in given) != ("--config-store-key" in given):
        have, lack = (
            ("--config-store-cert", "--config-store-key")
            if "--config-store-cert" in given
            else ("--config-store-key", "--config-store-cert")
        )
        raise LaunchError(f"{given[have][1]} needs {lack} (a client certificate and its key go together)")

    ca = _read_pem(given.get("--config-store-ca"), b"CERTIFICATE", "a PEM certificate")
    cert = _read_pem(given.get("--config-store-cert"), b"CERTIFICATE", "a PEM certificate")
    key = _read_pem(given.get("--config-store-key"), b"PRIVATE KEY", "a PEM private key")

    user = given.get("--config-store-user", (None, ""))[0]
    password, password_source = _password(given.get("--config-store-password-file"), environ)
    if user is not None and password is None:
        raise LaunchError(
            f"{given['--config-store-user'][1]} needs its password: export {PASSWORD_ENV} or give "
            "--config-store-password-file FILE (never on the command line, where every user of the host can read it)"
        )
    if user is None and password is not None:
        raise LaunchError(f"{password_source} is given without --config-store-user (or KUNGFU_CONFIG_STORE_USER)")
    if not tls and user is None:
        return None
    return EtcdSecurity(
        tls=tls,
        ca=ca,
        cert=cert,
        key=key,
        user=user,
        password=password,
        ca_source=given["--config-store-ca"][1] if ca is not None else "the system's trusted CAs",
        password_source=password_source,
    )


def _read_pem(given: tuple[str, str] | None, marker: bytes, what: str) -> bytes | None:
    if given is None:
        return None
    path, source = given
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise LaunchError(f"{source}: cannot read it ({e.strerror})") from None
    if b"-----BEGIN " not in data or marker not in data:
        raise LaunchError(f"{source}: the file holds no {what}")
    return data


def _password(file: tuple[str, str] | None, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The password and where it came from (the file wins over the variable)."""
    if file is not None:
        path, source = file
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise LaunchError(f"{source}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        if not lines or not lines[0]:
            raise LaunchError(f"{source}: the file is empty (its first line is the password)")
        return lines[0], f"the password of {source}"
    if PASSWORD_ENV in environ:
        if not environ[PASSWORD_ENV]:
            raise LaunchError(f"{PASSWORD_ENV} is empty")
        return environ[PASSWORD_ENV], f"the password of {PASSWORD_ENV}"
    return None, ""
