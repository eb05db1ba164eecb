"""Turning validated options into the concrete job this launcher runs."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kungfu_tf.run.plan.cli import LaunchOptions
from kungfu_tf.run.plan.local_host import choose_self_host
from kungfu_tf.run.plan.ports import (
    DEFAULT_PORT_RANGE,
    check_ports_free,
    find_free_ports,
    parse_port_range,
)
from kungfu_tf.run.worker_env.job_id import resolve_job_id
from kungfu_tf.run.worker_env.job_secret import resolve_job_secret
from kungfu_tf.run.worker_env.placement import (
    LOCALHOST,
    HostSlots,
    Peer,
    assign_range_ports,
    hosts_in_use,
    place_workers,
)
from kungfu_tf.run.worker_env.worker_env import build_worker_env


@dataclass(frozen=True)
class JobPlan:
    """Everything needed to start this host's share of the workers.

    ``secret`` is left out of ``repr``/``str`` so that printing or logging a
    plan never reveals the job secret.
    """

    peers: list[Peer]
    self_host: str
    command: list[str]
    topology: str
    timeout: int
    secret: str = field(repr=False)
    job_id: str
    logdir: Path | None
    quiet: bool

    @property
    def local_peers(self) -> list[Peer]:
        """The workers this launcher starts (those placed on ``self_host``)."""
        return [p for p in self.peers if p.host == self.self_host]

    def worker_env(self, peer: Peer, base: Mapping[str, str]) -> dict[str, str]:
        """Environment for ``peer``: ``base`` plus the ``KUNGFU_*`` variables."""
        return build_worker_env(
            base,
            peer,
            self.peers,
            topology=self.topology,
            timeout=self.timeout,
            secret=self.secret,
            job_id=self.job_id,
        )


def build_plan(options: LaunchOptions, environ: Mapping[str, str]) -> JobPlan:
    """Place the workers, choose ports, the secret and the run's id for this host.

    Raises:
        LaunchError: if the workers do not fit, this host cannot be
            identified, a port is unusable or the secret or the run's id is
            missing (multi-host) or malformed.
    """
    hosts = options.hosts or [HostSlots(LOCALHOST, options.np)]
    placements = place_workers(hosts, options.np)
    self_host = choose_self_host([h.host for h in hosts], options.self_host)
    multi_host = len(hosts_in_use(placements)) > 1
    secret = resolve_job_secret(environ, multi_host)
    job_id = resolve_job_id(environ, multi_host)
    local = [p for p in placements if p.host == self_host]

    if options.port_range is None and not multi_host and local:
        # Only one launcher computes this peer list, so it may use ports
        # that happen to be free now; that keeps concurrent jobs apart.
        ports = find_free_ports(self_host, len(local))
        peers = [Peer(p.rank, p.host, ports[p.local_index]) for p in placements]
    else:
        port_range = options.port_range or parse_port_range(DEFAULT_PORT_RANGE)
        peers = assign_range_ports(placements, port_range.first, port_range.last)
        check_ports_free(self_host, [p.port for p in peers if p.host == self_host])

    return JobPlan(
        peers=peers,
        self_host=self_host,
        command=options.command,
        topology=options.topology,
        timeout=options.timeout,
        secret=secret,
        job_id=job_id,
        logdir=options.logdir,
        quiet=options.quiet,
    )
