"""The environment variables through which the runtime learns its job.

The launcher writes them (:func:`build_worker_env`); a worker checks them at
start-up (:func:`read_worker_env`) with the same rules as the C++ runtime's
``RuntimeOptions::from_env``, so a malformed value is reported in Python,
naming the variable and its value, before any op runs.

Example:
    >>> from kungfu_tf.run.worker_env.worker_env import read_worker_env
    >>> env = read_worker_env({"KUNGFU_PEERS": "h:1,h:2", "KUNGFU_SELF": "h:2",
    ...                        "KUNGFU_JOB_SECRET": "ab" * 32})
    >>> env.rank, env.size, env.timeout_seconds
    (1, 2, None)
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kungfu_tf.run.worker_env.job_id import JOB_ID_ENV
from kungfu_tf.run.worker_env.placement import Peer

SELF_ENV = "KUNGFU_SELF"
PEERS_ENV = "KUNGFU_PEERS"
VERSION_ENV = "KUNGFU_CLUSTER_VERSION"
TIMEOUT_ENV = "KUNGFU_TIMEOUT"
SECRET_ENV = "KUNGFU_JOB_SECRET"
# Elastic jobs only (kungfu-run --elastic / --min-np):
CONFIG_SERVER_ENV = "KUNGFU_CONFIG_SERVER"  # host:port of the config service
ELASTIC_ENV = "KUNGFU_ELASTIC"  # "1": crashes are survived, resize is allowed
JOINER_ENV = "KUNGFU_JOINER"  # "1": started to grow the cluster, not yet a member
# "0": an elastic job's parameter servers keep their optimizer slots on the owner alone (no replicas).
SLOT_REPLICAS_ENV = "KUNGFU_SLOT_REPLICAS"
# The niceness a worker adds to its own when a shrink detaches it (0: keeps its priority).
DETACHED_NICE_ENV = "KUNGFU_DETACHED_NICE"
DEFAULT_DETACHED_NICE = 19

# The runtime keeps deadlines as int64 nanoseconds of a monotonic clock; int64
# overflows after 9.2e9 s, so some bound is needed. 1e6 s (11.6 days) is far
# longer than any one collective should wait, and far enough below the overflow
# that adding it to the clock's current reading can never wrap.
MAX_TIMEOUT_SECONDS = 1_000_000
MAX_CLUSTER_VERSION = 2**32 - 1  # the runtime's Cluster::version is uint32
# What the launcher generates: secrets.token_hex(32).
JOB_SECRET_PATTERN = re.compile(r"[0-9a-fA-F]{64}")
_DECIMAL = re.compile(r"[0-9]+")


class WorkerEnvError(ValueError):
    """A ``KUNGFU_*`` variable is malformed; the message names it and its value."""


def build_worker_env(
    base: Mapping[str, str],
    me: Peer,
    peers: Sequence[Peer],
    *,
    topology: str,
    timeout: int,
    secret: str,
    job_id: str,
    cluster_version: int = 0,
    config_server: str | None = None,
    joiner: bool = False,
) -> dict[str, str]:
    """Return ``base`` plus the ``KUNGFU_*`` variables for worker ``me``.

    ``base`` is normally the launcher's own environment so the worker runs
    with the same PATH/virtualenv.  PYTHONUNBUFFERED makes Python workers
    flush each line, otherwise piped output would arrive in 8 KiB bursts.

    ``config_server`` (an elastic job's config service) also sets
    ``KUNGFU_ELASTIC=1``; a ``joiner`` is started as a one-worker cluster at
    version 0 (``peers == [me]``) that the config service admits later.
    Variables of an elastic job that ``base`` may carry from an enclosing
    job are removed otherwise, so that they never leak into a plain job.
    """
    if joiner and config_server is None:
        raise ValueError("a joiner needs the elastic job's config_server")
    env = {k: v for k, v in base.items() if k not in (CONFIG_SERVER_ENV, ELASTIC_ENV, JOINER_ENV)}
    if config_server is not None:
        env[CONFIG_SERVER_ENV] = config_server
        env[ELASTIC_ENV] = "1"
        if joiner:
            env[JOINER_ENV] = "1"
    env.update(
        {
            SELF_ENV: me.address,
            PEERS_ENV: ",".join(p.address for p in peers),
            VERSION_ENV: str(cluster_version),
            "KUNGFU_TOPOLOGY": topology,
            TIMEOUT_ENV: str(timeout),
            SECRET_ENV: secret,
            JOB_ID_ENV: job_id,
            # Its position in `peers`: a joiner (peers == [me]) is rank 0 of 1
            # until admitted, whatever number the launcher gave it.
            "KUNGFU_RANK": str([p.address for p in peers].index(me.address)),
            "KUNGFU_SIZE": str(len(peers)),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


@dataclass(frozen=True)
class WorkerEnv:
    """The checked ``KUNGFU_*`` variables of one worker.

    ``peers`` is empty outside the launcher (a one-worker cluster);
    ``timeout_seconds`` is None when the runtime's default applies.
    ``config_server`` is the elastic job's config service (None in a job of
    fixed size); ``joiner`` says this worker waits to be admitted.
    """

    peers: tuple[str, ...]
    self_address: str
    cluster_version: int
    timeout_seconds: float | None
    secret: str = field(repr=False)
    config_server: str | None = None
    elastic: bool = False
    joiner: bool = False
    detached_nice: int = DEFAULT_DETACHED_NICE

    @property
    def size(self) -> int:
        """Number of workers (1 without a peer list)."""
        return max(len(self.peers), 1)

    @property
    def rank(self) -> int:
        """Position of ``self_address`` in ``peers`` (0 without a peer list)."""
        return self.peers.index(self.self_address) if self.peers else 0

    def _host(self, address: str) -> str:
        return address.rsplit(":", 1)[0]

    @property
    def local_peers(self) -> list[str]:
        """The peers on this worker's host, in rank order."""
        if not self.peers:
            return [self.self_address]
        host = self._host(self.self_address)
        return [p for p in self.peers if self._host(p) == host]


def parse_timeout_seconds(text: str, source: str) -> float:
    """``text`` as a timeout in seconds: finite, > 0 and <= MAX_TIMEOUT_SECONDS.

    ``source`` names where it came from (``--timeout``, ``KUNGFU_TIMEOUT``).

    Example:
        >>> parse_timeout_seconds("2.5", "KUNGFU_TIMEOUT")
        2.5
    """
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_SECONDS):
        raise WorkerEnvError(
            f"{source} must be a number of seconds in (0, {MAX_TIMEOUT_SECONDS}], got {text!r}"
        )
    return value


def _parse_peer(text: str, variable: str) -> str:
    host, colon, port = text.rpartition(":")
    if not (host and colon and _DECIMAL.fullmatch(port) and 1 <= int(port) <= 65535):
        raise WorkerEnvError(f"{variable}: bad peer address {text!r}, expected host:port with port 1..65535")
    return text


def read_detached_nice(environ: Mapping[str, str]) -> int:
    """``KUNGFU_DETACHED_NICE``: the niceness a detached worker adds to its own (0..19; unset: 19).

    A worker that a shrink detached only tears down from then on; on a host
    it shares with members, its exit should not take their CPU
    (kungfu_tf/ops/elastic_membership.py, where it is applied).

    Example:
        >>> read_detached_nice({}), read_detached_nice({"KUNGFU_DETACHED_NICE": "0"})
        (19, 0)
    """
    text = environ.get(DETACHED_NICE_ENV, "")
    if not text:
        return DEFAULT_DETACHED_NICE
    if not _DECIMAL.fullmatch(text) or int(text) > 19:
        raise WorkerEnvError(f"{DETACHED_NICE_ENV} must be a niceness in 0..19 (0: keep the priority), got {text!r}")
    return int(text)


def read_slot_replicas(environ: Mapping[str, str]) -> bool:
    """``KUNGFU_SLOT_REPLICAS``: whether an elastic job's parameter-server slots are replicated (unset: yes).

    Example:
        >>> read_slot_replicas({}), read_slot_replicas({"KUNGFU_SLOT_REPLICAS": "0"})
        (True, False)
    """
    return environ.get(SLOT_REPLICAS_ENV, "") == "" or _parse_flag(environ, SLOT_REPLICAS_ENV)


def _parse_flag(environ: Mapping[str, str], variable: str) -> bool:
    """An unset or empty variable, ``0`` or ``1``."""
    text = environ.get(variable, "")
    if text not in ("", "0", "1"):
        raise WorkerEnvError(f"{variable} must be 0 or 1, got {text!r}")
    return text == "1"


def _read_elastic(environ: Mapping[str, str], peers: tuple[str, ...], self_text: str, version: int):
    """The elastic variables: (config_server, elastic, joiner), checked together.

    An elastic worker must know where the config service is (or it cannot
    follow membership changes), and a joiner is by construction a one-worker
    cluster of itself at version 0 until the config service admits it.
    """
    elastic = _parse_flag(environ, ELASTIC_ENV)
    joiner = _parse_flag(environ, JOINER_ENV)
    server_text = environ.get(CONFIG_SERVER_ENV, "")
    config_server = _parse_peer(server_text, CONFIG_SERVER_ENV) if server_text else None
    if elastic and config_server is None:
        raise WorkerEnvError(f"{ELASTIC_ENV}=1 needs {CONFIG_SERVER_ENV} (host:port of the config service), which is not set")
    if joiner:
        if not elastic:
            raise WorkerEnvError(f"{JOINER_ENV}=1 is only valid in an elastic job ({ELASTIC_ENV}=1), got {ELASTIC_ENV}={environ.get(ELASTIC_ENV, '')!r}")
        if peers != (self_text,):
            raise WorkerEnvError(
                f"{JOINER_ENV}=1: a joiner starts as a cluster of itself, so {PEERS_ENV} must be "
                f"{SELF_ENV}={self_text!r}, got {PEERS_ENV}={environ.get(PEERS_ENV, '')!r}"
            )
        if version != 0:
            raise WorkerEnvError(f"{JOINER_ENV}=1: a joiner starts at {VERSION_ENV}=0, got {version}")
    return config_server, elastic, joiner


def read_worker_env(environ: Mapping[str, str]) -> WorkerEnv:
    """Check the ``KUNGFU_*`` variables of ``environ`` as the runtime will read them.

    Raises:
        WorkerEnvError: naming the variable and its value, if one is malformed
            (for example ``KUNGFU_CLUSTER_VERSION=abc``, ``KUNGFU_TIMEOUT=nan``, ``KUNGFU_DETACHED_NICE=-5``,
            ``KUNGFU_SLOT_REPLICAS=yes``,
            a one-character ``KUNGFU_JOB_SECRET``, or a ``KUNGFU_SELF`` that
            ``KUNGFU_PEERS`` does not list), or if the elastic variables
            contradict each other (``KUNGFU_ELASTIC=1`` without
            ``KUNGFU_CONFIG_SERVER``, ``KUNGFU_JOINER=1`` outside an elastic
            job or with other peers than itself).
    """
    peers_text = environ.get(PEERS_ENV, "")
    peers = tuple(_parse_peer(p, PEERS_ENV) for p in peers_text.split(",") if p)
    if peers_text and not peers:
        raise WorkerEnvError(f"{PEERS_ENV} is set but lists no peer: {peers_text!r}")
    duplicates = sorted({p for p in peers if peers.count(p) > 1})
    if duplicates:
        raise WorkerEnvError(f"{PEERS_ENV}: {duplicates[0]} appears twice in {peers_text!r}")

    self_text = environ.get(SELF_ENV, "")
    if peers:
        _parse_peer(self_text, SELF_ENV)
        if self_text not in peers:
            raise WorkerEnvError(f"{SELF_ENV}={self_text!r} is not in {PEERS_ENV}={peers_text!r}")

    version_text = environ.get(VERSION_ENV, "")
    version = 0
    if version_text:
        if not _DECIMAL.fullmatch(version_text) or int(version_text) > MAX_CLUSTER_VERSION:
            raise WorkerEnvError(
                f"{VERSION_ENV} must be a decimal integer in 0..{MAX_CLUSTER_VERSION}, got {version_text!r}"
            )
        version = int(version_text)

    timeout_text = environ.get(TIMEOUT_ENV, "")
    timeout = parse_timeout_seconds(timeout_text, TIMEOUT_ENV) if timeout_text else None

    secret = environ.get(SECRET_ENV, "")
    if secret and not JOB_SECRET_PATTERN.fullmatch(secret):
        # The value itself is not printed: it is (meant to be) a secret.
        raise WorkerEnvError(
            f"{SECRET_ENV} must be 64 hexadecimal characters as kungfu-run generates it, "
            f"got {len(secret)} characters"
        )
    if not secret and len(peers) > 1:
        raise WorkerEnvError(f"{SECRET_ENV} is not set: start the workers with kungfu-run, which generates it")
    config_server, elastic, joiner = _read_elastic(environ, peers, self_text, version)
    nice = read_detached_nice(environ)
    read_slot_replicas(environ)
    return WorkerEnv(peers, self_text, version, timeout, secret, config_server, elastic, joiner, nice)
