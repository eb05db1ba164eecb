"""The id of one run of a job, which binds the workers' connections to it.

Workers authenticate each other with the job secret, and a multi-host job
reuses an exported secret across runs. The runtime's handshake also covers
this id (and the cluster version), so a worker left over from an earlier run
that holds the same secret cannot join, or be joined by, this run.
"""

import re
from collections.abc import Mapping

from kungfu_tf.run.worker_env.host_shared_value import resolve_host_shared_value

JOB_ID_ENV = "KUNGFU_JOB_ID"
MAX_JOB_ID_LEN = 128  # kHandshakeMaxJobIdLen in ops/runtime/handshake.h
_JOB_ID_RE = re.compile(rf"[\x20-\x7e]{{1,{MAX_JOB_ID_LEN}}}")


def resolve_job_id(environ: Mapping[str, str], multi_host: bool) -> str:
    """Return this run's id: the launcher's own env var or a fresh one.

    Launchers on different hosts cannot agree on a random value without
    talking to each other, so a multi-host job requires the user to export
    the same ``KUNGFU_JOB_ID`` on every host, a new one for every run (a
    scheduler's job id will do, e.g. ``$SLURM_JOB_ID``); a single-host job
    generates one when it is unset.

    Example:
        >>> len(resolve_job_id({}, multi_host=False))
        32
        >>> resolve_job_id({"KUNGFU_JOB_ID": "run-7"}, multi_host=True)
        'run-7'

    Raises:
        LaunchError: if the variable is malformed, or missing for a
            multi-host job.
    """
    return resolve_host_shared_value(
        environ,
        JOB_ID_ENV,
        _JOB_ID_RE,
        f"{JOB_ID_ENV} must be 1 to {MAX_JOB_ID_LEN} printable ASCII characters, got {environ.get(JOB_ID_ENV)!r}",
        16,
        multi_host,
        export_hint=", a new one for each run",
    )
