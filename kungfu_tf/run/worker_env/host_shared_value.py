"""A value every launcher of a job must agree on (the job secret, the run id).

Launchers on different hosts cannot agree on a random value without talking
to each other, so a multi-host job needs the user to export the same value on
every host; a single-host launcher generates a fresh one when it is unset.
"""

import re
import secrets
from collections.abc import Mapping

from kungfu_tf.run.errors import LaunchError


def resolve_host_shared_value(
    environ: Mapping[str, str],
    variable: str,
    pattern: re.Pattern[str],
    malformed: str,
    token_bytes: int,
    multi_host: bool,
    export_hint: str = "",
) -> str:
    """Return ``environ[variable]`` if well-formed, else a fresh random value.

    ``malformed`` is the error for a value ``pattern`` does not match (it must
    not quote a secret); ``export_hint`` is added to the multi-host error.

    Example:
        >>> hexes = re.compile(r"[0-9a-f]{8}")
        >>> resolve_host_shared_value({"V": "0123abcd"}, "V", hexes, "bad", 4, multi_host=True)
        '0123abcd'
        >>> len(resolve_host_shared_value({}, "V", hexes, "bad", 4, multi_host=False))
        8

    Raises:
        LaunchError: if the variable is malformed, or missing for a
            multi-host job.
    """
    value = environ.get(variable, "")
    if value:
        if not pattern.fullmatch(value):
            raise LaunchError(malformed)
        return value
    if multi_host:
        raise LaunchError(
            f"a multi-host job needs the same {variable} exported on every "
            f"host{export_hint}, e.g. export {variable}=$(python3 -c "
            f"'import secrets; print(secrets.token_hex({token_bytes}))')"
        )
    return secrets.token_hex(token_bytes)
