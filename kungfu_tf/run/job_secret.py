"""The shared secret workers use to authenticate each other's connections."""

import secrets
from collections.abc import Mapping

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.worker_env import JOB_SECRET_PATTERN, SECRET_ENV


def resolve_job_secret(environ: Mapping[str, str], multi_host: bool) -> str:
    """Return the job secret: the launcher's own env var or a fresh one.

    Launchers on different hosts cannot agree on a random value without
    talking to each other, so a multi-host job requires the user to export
    the same ``KUNGFU_JOB_SECRET`` on every host; a single-host job
    generates one when it is unset.

    Raises:
        LaunchError: if the variable is malformed, or missing for a
            multi-host job.
    """
    value = environ.get(SECRET_ENV, "")
    if value:
        if not JOB_SECRET_PATTERN.fullmatch(value):
            raise LaunchError(f"{SECRET_ENV} must be 64 hexadecimal characters")
        return value
    if multi_host:
        raise LaunchError(
            f"a multi-host job needs the same {SECRET_ENV} exported on every "
            f"host, e.g. export {SECRET_ENV}=$(python3 -c "
            "'import secrets; print(secrets.token_hex(32))')"
        )
    return secrets.token_hex(32)
