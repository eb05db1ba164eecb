"""Jobs started by ``mpirun`` or ``srun`` instead of ``kungfu-run``.

Users of Horovod start training with ``mpirun -np 4 python train.py``
(Open MPI) or ``srun python train.py`` (Slurm). Those launchers tell each
process its rank, the job's size and its nodes in their own environment
variables; this module turns them into the ``KUNGFU_*`` variables that
``kungfu-run`` would have set (:mod:`kungfu_tf.run.worker_env.worker_env`), before the
op library loads (:func:`kungfu_tf._native.library`), so the runtime starts
the same job. ``KUNGFU_PEERS`` always wins: a worker of ``kungfu-run`` is
never reinterpreted, even inside an ``mpirun`` or Slurm job.

What each launcher provides, and what is derived:

* Peers: ``host:port`` per rank. One node: 127.0.0.1. Several nodes: Slurm
  lists them (``SLURM_STEP_NODELIST``, block distribution only); Open MPI
  does not export its host list, so the user passes it
  (``mpirun -x KUNGFU_HOSTS=a:2,b:2``) and the ranks must be mapped by slot,
  mpirun's default (checked against each rank's local rank and local size).
* Port of a rank: a base plus its local rank. The base is
  ``KUNGFU_PORT_BASE`` if set, otherwise derived from the launcher's job
  id (:func:`derived_port_base`), so every process computes the same peer
  list without talking to the others.
* Job secret: ``KUNGFU_JOB_SECRET`` if set. Otherwise, under Open MPI, it is
  derived from ``OMPI_MCA_orte_precondition_transports``, a random 128-bit
  value mpirun generates per job and gives every rank, with HKDF-SHA256
  (RFC 5869; :func:`derive_job_secret`). Slurm has no such value: the user
  exports ``KUNGFU_JOB_SECRET`` before ``srun``, which forwards it.
* Job id: ``KUNGFU_JOB_ID`` if set, else ``ompi-<jobid>`` /
  ``slurm-<job>.<step>``.

A launch of one process needs none of this: it stays a one-worker cluster,
as without any launcher.

Example:
    >>> env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
    ...        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    ...        "OMPI_MCA_orte_num_nodes": "1", "OMPI_MCA_ess_base_jobid": "7",
    ...        "OMPI_MCA_orte_precondition_transports": "0123456789abcdef-0123456789abcdef",
    ...        "KUNGFU_PORT_BASE": "30000"}
    >>> launch = detect_external_launch(env)
    >>> launch.peers, launch.self_address
    (('127.0.0.1:30000', '127.0.0.1:30001'), '127.0.0.1:30001')
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import socket
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.worker_env.job_id import JOB_ID_ENV, MAX_JOB_ID_LEN
from kungfu_tf.run.worker_env.placement import LOCALHOST, HostSlots, parse_hosts
from kungfu_tf.run.worker_env.slurm_hostlist import (
    expand_hostlist,
    expand_tasks_per_node,
)
from kungfu_tf.run.worker_env.worker_env import (
    JOB_SECRET_PATTERN,
    PEERS_ENV,
    SECRET_ENV,
    SELF_ENV,
    VERSION_ENV,
    WorkerEnvError,
)

HOSTS_ENV = "KUNGFU_HOSTS"  # Open MPI across nodes: host:slots,... in mpirun's order
PORT_BASE_ENV = "KUNGFU_PORT_BASE"

# Derived port bases lie in [20000, 32160): below Linux's default ephemeral
# range (32768-60999), so outgoing connections do not take them, and above
# the 10000-11000 that kungfu-run uses by default. Windows of 64 ports: two
# jobs on one host collide only if their ids hash to the same window
# (1 in 190) and both have ranks there.
PORT_WINDOW_FIRST = 20000
PORT_WINDOW_WIDTH = 64
PORT_WINDOWS = 190

_DECIMAL = re.compile(r"[0-9]+")
_OMPI_TRANSPORTS = re.compile(r"[0-9a-fA-F]{1,16}-[0-9a-fA-F]{1,16}")
_SECRET_LABEL = b"kungfu_tf job secret v1"


class ExternalLaunchError(WorkerEnvError):
    """A launcher's variable is missing, malformed or unsupported; the message names it."""


@dataclass(frozen=True)
class ExternalLaunch:
    """This process's place in a job that ``mpirun`` or ``srun`` started.

    ``port_source`` says where the port base came from, for error messages.
    """

    launcher: str
    rank: int
    local_rank: int
    peers: tuple[str, ...]
    job_id: str
    port_source: str
    secret: str = field(repr=False)

    @property
    def size(self) -> int:
        """Number of processes in the job."""
        return len(self.peers)

    @property
    def self_address(self) -> str:
        """This process's ``host:port``."""
        return self.peers[self.rank]

    def worker_env(self) -> dict[str, str]:
        """The ``KUNGFU_*`` variables ``kungfu-run`` would give this worker."""
        return {
            SELF_ENV: self.self_address,
            PEERS_ENV: ",".join(self.peers),
            VERSION_ENV: "0",
            SECRET_ENV: self.secret,
            JOB_ID_ENV: self.job_id,
            "KUNGFU_RANK": str(self.rank),
            "KUNGFU_SIZE": str(self.size),
        }


def _int(environ: Mapping[str, str], variable: str, minimum: int, *, default: int | None = None) -> int:
    """A decimal variable >= ``minimum``; ExternalLaunchError naming it otherwise."""
    text = environ.get(variable)
    if text is None and default is not None:
        return default
    if text is None:
        raise ExternalLaunchError(f"{variable} is not set")
    if not _DECIMAL.fullmatch(text) or int(text) < minimum:
        raise ExternalLaunchError(f"{variable} must be a decimal integer >= {minimum}, got {text!r}")
    return int(text)


def _below(environ: Mapping[str, str], variable: str, bound_variable: str, bound: int) -> int:
    value = _int(environ, variable, 0)
    if value >= bound:
        raise ExternalLaunchError(f"{variable}={value} must be less than {bound_variable}={bound}")
    return value


def derive_job_secret(key_material: str, job_id: str) -> str:
    """A 64-hex job secret from a launcher's per-job random value (HKDF-SHA256).

    HKDF-Extract with ``job_id`` as salt, then one block of HKDF-Expand with
    a fixed label (RFC 5869): every rank computes the same secret, which
    reveals nothing about ``key_material`` and differs from any other use
    of it.

    Example:
        >>> len(derive_job_secret("0123456789abcdef-0123456789abcdef", "ompi-7"))
        64
    """
    prk = hmac.new(job_id.encode(), key_material.encode(), hashlib.sha256).digest()
    return hmac.new(prk, _SECRET_LABEL + b"\x01", hashlib.sha256).hexdigest()


def derived_port_base(job_key: str) -> int:
    """The first port of a job's window, a function of its launcher job id.

    Example:
        >>> PORT_WINDOW_FIRST <= derived_port_base("ompi-7") < PORT_WINDOW_FIRST + PORT_WINDOWS * PORT_WINDOW_WIDTH
        True
    """
    digest = int.from_bytes(hashlib.sha256(job_key.encode()).digest()[:8], "big")
    return PORT_WINDOW_FIRST + (digest % PORT_WINDOWS) * PORT_WINDOW_WIDTH


def _port_base(environ: Mapping[str, str], job_id: str, max_local_size: int) -> tuple[int, str]:
    """(base, where it came from); the base's window must hold ``max_local_size`` ports."""
    text = environ.get(PORT_BASE_ENV)
    if text is None:
        base, source = derived_port_base(job_id), f"derived from the job id {job_id!r}"
    else:
        if not _DECIMAL.fullmatch(text) or not 1 <= int(text) <= 65535:
            raise ExternalLaunchError(f"{PORT_BASE_ENV} must be a port number in 1..65535, got {text!r}")
        base, source = int(text), f"{PORT_BASE_ENV}={text}"
    if base + max_local_size - 1 > 65535:
        raise ExternalLaunchError(
            f"port base {base} ({source}) + {max_local_size} ranks on one host exceeds port 65535: "
            f"set {PORT_BASE_ENV} to a lower port"
        )
    return base, source


def _job_id(environ: Mapping[str, str], derived: str) -> str:
    text = environ.get(JOB_ID_ENV) or derived
    if len(text) > MAX_JOB_ID_LEN or not text.isascii() or not text.isprintable():
        raise ExternalLaunchError(
            f"{JOB_ID_ENV} must be 1 to {MAX_JOB_ID_LEN} printable ASCII characters, got {text!r}"
        )
    return text


def _given_secret(environ: Mapping[str, str]) -> str | None:
    text = environ.get(SECRET_ENV)
    if not text:
        return None
    if not JOB_SECRET_PATTERN.fullmatch(text):
        # The value itself is not printed: it is (meant to be) a secret.
        raise ExternalLaunchError(f"{SECRET_ENV} must be 64 hexadecimal characters, got {len(text)} characters")
    return text


def _peers(hosts: list[HostSlots], base: int) -> tuple[str, ...]:
    """Ranks fill each host's slots in order; local rank j listens on base + j."""
    return tuple(f"{h.host}:{base + j}" for h in hosts for j in range(h.slots))


def _ompi_hosts(environ: Mapping[str, str], size: int) -> list[HostSlots]:
    """The job's hosts and ranks per host, in rank order (mpirun's by-slot mapping)."""
    num_nodes = _int(environ, "OMPI_MCA_orte_num_nodes", 1)
    text = environ.get(HOSTS_ENV)
    if not text:
        if num_nodes > 1:
            raise ExternalLaunchError(
                f"mpirun started this job on {num_nodes} nodes (OMPI_MCA_orte_num_nodes={num_nodes}), "
                f"but Open MPI does not tell its processes the other nodes' addresses: pass them in "
                f"mpirun's host order with the ranks on each, e.g. mpirun -x {HOSTS_ENV}=host1:2,host2:2 "
                f"(ranks mapped by slot, mpirun's default)"
            )
        return [HostSlots(LOCALHOST, size)]
    try:
        hosts = parse_hosts(text)
    except LaunchError as e:
        raise ExternalLaunchError(f"{HOSTS_ENV}={text!r}: {e}") from None
    total = sum(h.slots for h in hosts)
    if total != size or len(hosts) != num_nodes:
        raise ExternalLaunchError(
            f"{HOSTS_ENV}={text!r} lists {len(hosts)} hosts with {total} ranks, but mpirun started "
            f"{size} ranks (OMPI_COMM_WORLD_SIZE) on {num_nodes} nodes (OMPI_MCA_orte_num_nodes)"
        )
    return hosts


def _check_by_slot(hosts: list[HostSlots], rank: int, local_rank: int, local_size: int | None, launcher: str,
                   mapping: str) -> None:
    """This rank's host in ``hosts`` must be where the launcher says it runs.

    Compares the local rank (and local size, where the launcher tells it)
    that filling the hosts in order gives with the launcher's own: they
    differ under another mapping (e.g. ``mpirun --map-by node``), which
    would give the processes different peer lists.
    """
    first = 0
    for h in hosts:
        if rank < first + h.slots:
            if rank - first != local_rank or local_size not in (None, h.slots):
                told = f"local rank {local_rank}" + (f" of {local_size}" if local_size is not None else "")
                raise ExternalLaunchError(
                    f"{launcher} rank {rank} is {told} on its node, but {mapping} makes it local rank "
                    f"{rank - first} of {h.slots} on {h.host}: start the ranks mapped in consecutive "
                    f"blocks per node"
                )
            return
        first += h.slots


def from_open_mpi(environ: Mapping[str, str]) -> ExternalLaunch:
    """This process's place in a job that Open MPI's ``mpirun`` started.

    Raises:
        ExternalLaunchError: naming the variable and its value if one is
            missing or malformed, a job on several nodes has no
            ``KUNGFU_HOSTS``, or the ranks are not mapped by slot.
    """
    size = _int(environ, "OMPI_COMM_WORLD_SIZE", 1)
    rank = _below(environ, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", size)
    local_size = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", 1)
    local_rank = _below(environ, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", local_size)
    hosts = _ompi_hosts(environ, size)
    policy = environ.get("OMPI_MCA_rmaps_base_mapping_policy", "")
    if len(hosts) > 1 and policy.split(":")[0].lower() in ("node", "seq", "dist"):
        # mpirun --map-by node/seq/dist: ranks do not fill each node in turn.
        raise ExternalLaunchError(
            f"OMPI_MCA_rmaps_base_mapping_policy={policy!r}: across nodes only mpirun's default mapping "
            f"(by slot, or by core/socket: consecutive ranks on one node) is supported, as {HOSTS_ENV} "
            f"assumes; drop --map-by {policy.split(':')[0]}"
        )
    mapping = f"by-slot mapping of {HOSTS_ENV}={environ[HOSTS_ENV]!r}" if environ.get(HOSTS_ENV) else "one node"
    _check_by_slot(hosts, rank, local_rank, local_size, "Open MPI", mapping)
    jobid_text = str(_int(environ, "OMPI_MCA_ess_base_jobid", 0))
    job_id = _job_id(environ, f"ompi-{jobid_text}")
    base, source = _port_base(environ, job_id, max(h.slots for h in hosts))
    secret = _given_secret(environ)
    if secret is None and size > 1:
        transports = environ.get("OMPI_MCA_orte_precondition_transports", "")
        if not _OMPI_TRANSPORTS.fullmatch(transports):
            raise ExternalLaunchError(
                f"OMPI_MCA_orte_precondition_transports={transports!r} is not the per-job random value "
                f"mpirun sets (hex-hex), so no job secret can be derived: export the same 64-hex "
                f"{SECRET_ENV} to every rank (mpirun -x {SECRET_ENV})"
            )
        secret = derive_job_secret(transports, job_id)
    return ExternalLaunch("Open MPI", rank, local_rank, _peers(hosts, base), job_id, source, secret or "")


def _check_block_distribution(environ: Mapping[str, str]) -> None:
    """Slurm's node-level distribution must be block (its default when unset)."""
    text = environ.get("SLURM_DISTRIBUTION", "")
    # "block", "block:cyclic" (the part after ':' is within a node), "block,pack".
    node_level = re.split(r"[:,]", text, maxsplit=1)[0]
    if text and node_level != "block":
        raise ExternalLaunchError(
            f"SLURM_DISTRIBUTION={text!r}: only block distribution across nodes is supported (consecutive "
            f"ranks on one node, Slurm's default): start with srun --distribution=block"
        )


def from_slurm(environ: Mapping[str, str]) -> ExternalLaunch:
    """This process's place in a job step that Slurm's ``srun`` started.

    Raises:
        ExternalLaunchError: naming the variable and its value if one is
            missing or malformed, the distribution is not block, or a step
            of several tasks has no ``KUNGFU_JOB_SECRET``.
    """
    size = _int(environ, "SLURM_NTASKS", 1)
    rank = _below(environ, "SLURM_PROCID", "SLURM_NTASKS", size)
    local_rank = _int(environ, "SLURM_LOCALID", 0)
    _check_block_distribution(environ)
    nodes_text = environ.get("SLURM_STEP_NODELIST", "")
    nodes = expand_hostlist(nodes_text, "SLURM_STEP_NODELIST")
    tasks_text = environ.get("SLURM_STEP_TASKS_PER_NODE", "")
    if not tasks_text:
        raise ExternalLaunchError("SLURM_STEP_TASKS_PER_NODE is not set (srun sets it with SLURM_STEP_NODELIST)")
    tasks = expand_tasks_per_node(tasks_text, "SLURM_STEP_TASKS_PER_NODE")
    if len(tasks) != len(nodes) or sum(tasks) != size:
        raise ExternalLaunchError(
            f"SLURM_STEP_TASKS_PER_NODE={tasks_text!r} ({len(tasks)} nodes, {sum(tasks)} tasks) does not "
            f"match SLURM_STEP_NODELIST={nodes_text!r} ({len(nodes)} nodes) and SLURM_NTASKS={size}"
        )
    hosts = [HostSlots(LOCALHOST if len(nodes) == 1 else n, t) for n, t in zip(nodes, tasks)]
    _check_by_slot(hosts, rank, local_rank, None, "Slurm",
                   f"block distribution of SLURM_STEP_TASKS_PER_NODE={tasks_text!r}")
    job_text = str(_int(environ, "SLURM_JOB_ID", 0))
    step_text = str(_int(environ, "SLURM_STEP_ID", 0, default=0))
    job_id = _job_id(environ, f"slurm-{job_text}.{step_text}")
    base, source = _port_base(environ, job_id, max(tasks))
    secret = _given_secret(environ)
    if secret is None and size > 1:
        raise ExternalLaunchError(
            f"srun started {size} tasks (SLURM_NTASKS={size}) but {SECRET_ENV} is not set, and Slurm has no "
            f"per-job secret to derive one from: export {SECRET_ENV}=$(python -c 'import secrets; "
            f"print(secrets.token_hex(32))') before srun, which forwards it to every task"
        )
    return ExternalLaunch("Slurm", rank, local_rank, _peers(hosts, base), job_id, source, secret or "")


def detect_external_launch(environ: Mapping[str, str]) -> ExternalLaunch | None:
    """This process's place in an ``mpirun``/``srun`` job; None if there is none.

    None when ``KUNGFU_PEERS`` is set (``kungfu-run`` started the worker) or
    no launcher's variables are present. Open MPI's are looked at first:
    ``mpirun`` inside a Slurm allocation starts its ranks with both. Slurm
    is recognised by ``SLURM_STEP_NODELIST``, which ``srun`` sets for its
    tasks: a plain ``python train.py`` in an ``sbatch`` script (which sees
    ``SLURM_PROCID``/``SLURM_NTASKS`` of the allocation) stays a one-worker
    cluster.

    Raises:
        ExternalLaunchError: see :func:`from_open_mpi`, :func:`from_slurm`.
    """
    if environ.get(PEERS_ENV):
        return None
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return from_open_mpi(environ)
    if "SLURM_STEP_NODELIST" in environ and "SLURM_PROCID" in environ:
        return from_slurm(environ)
    return None


def check_port_free(launch: ExternalLaunch) -> None:
    """Fail at start, naming the port and the override, if this rank's port is taken.

    The runtime would only say that it cannot listen; here the message can
    say where the port came from and how to choose another.

    Raises:
        ExternalLaunchError: if the port is in use on this host.
    """
    host, _, port_text = launch.self_address.rpartition(":")
    port = int(port_text)
    try:
        socket.inet_aton(host)
        bind_host = host  # the runtime listens on a literal address only
    except OSError:
        bind_host = ""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind_host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                raise
            raise ExternalLaunchError(
                f"port {port}, where {launch.launcher} rank {launch.rank} (local rank {launch.local_rank}) "
                f"must listen, is in use on this host (port base {port - launch.local_rank}, "
                f"{launch.port_source}; each rank uses base + local rank): set {PORT_BASE_ENV} to the "
                f"first of a free range of ports, the same for every rank (mpirun -x {PORT_BASE_ENV}=N, "
                f"or export it before srun)"
            ) from None


def apply_external_launch(environ: MutableMapping[str, str] | None = None) -> ExternalLaunch | None:
    """Writes the ``KUNGFU_*`` variables of an ``mpirun``/``srun`` job into ``environ``.

    ``environ`` defaults to ``os.environ``, which the C++ runtime reads when
    the op library loads. A job of one process is left alone (a one-worker
    cluster). Calling it again is harmless: ``KUNGFU_PEERS`` is set then.

    Example::

        apply_external_launch()  # in kungfu_tf._native.library()

    Raises:
        ExternalLaunchError: see :func:`detect_external_launch` and
            :func:`check_port_free`.
    """
    environ = os.environ if environ is None else environ
    launch = detect_external_launch(environ)
    if launch is None or launch.size == 1:
        return launch
    check_port_free(launch)
    environ.update(launch.worker_env())
    return launch
