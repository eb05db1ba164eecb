"""The environment variables through which the runtime learns its job."""

from collections.abc import Mapping, Sequence

from kungfu_tf.run.placement import Peer


def build_worker_env(
    base: Mapping[str, str],
    me: Peer,
    peers: Sequence[Peer],
    *,
    topology: str,
    timeout: int,
    secret: str,
    job_id: str,
) -> dict[str, str]:
    """Return ``base`` plus the ``KUNGFU_*`` variables for worker ``me``.

    ``base`` is normally the launcher's own environment so the worker runs
    with the same PATH/virtualenv.  PYTHONUNBUFFERED makes Python workers
    flush each line, otherwise piped output would arrive in 8 KiB bursts.
    """
    env = dict(base)
    env.update(
        {
            "KUNGFU_SELF": me.address,
            "KUNGFU_PEERS": ",".join(p.address for p in peers),
            "KUNGFU_CLUSTER_VERSION": "0",
            "KUNGFU_TOPOLOGY": topology,
            "KUNGFU_TIMEOUT": str(timeout),
            "KUNGFU_JOB_SECRET": secret,
            "KUNGFU_JOB_ID": job_id,
            "KUNGFU_RANK": str(me.rank),
            "KUNGFU_SIZE": str(len(peers)),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env
