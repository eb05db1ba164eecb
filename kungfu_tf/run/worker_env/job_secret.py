"""The shared secret workers use to authenticate each other's connections."""

from collections.abc import Mapping

from kungfu_tf.run.worker_env.host_shared_value import resolve_host_shared_value
from kungfu_tf.run.worker_env.worker_env import JOB_SECRET_PATTERN, SECRET_ENV


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
    return resolve_host_shared_value(
        environ, SECRET_ENV, JOB_SECRET_PATTERN, f"{SECRET_ENV} must be 64 hexadecimal characters", 32, multi_host
    )
