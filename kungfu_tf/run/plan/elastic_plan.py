"""Turning the options of an elastic job (``--elastic``/``--min-np``) into this launcher's role.

One launcher serves the config service: the only one of a single-host job,
or the one on the ``--config-server`` host of a multi-host job (the same
command runs on every host, so every launcher can tell whether it is that
one). It places the initial workers on the hosts as ``-H`` does, commits
them as cluster version 1, and places every joiner. The other launchers
connect to it, start the members of version 1 placed on their host, and
later the joiners it places there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kungfu_tf.run.control.etcd_security import EtcdSecurity
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.cli import LaunchOptions
from kungfu_tf.run.plan.config_store import (
    CONFIG_STORE_ENV,
    parse_config_store,
    uses_tls,
)
from kungfu_tf.run.plan.config_store_security import resolve_store_security
from kungfu_tf.run.plan.host_discovery import run_discovery_script
from kungfu_tf.run.plan.local_host import choose_self_host
from kungfu_tf.run.plan.ports import (
    DEFAULT_PORT_RANGE,
    PortRange,
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
    place_workers,
)


@dataclass(frozen=True)
class ElasticPlan:
    """This launcher's part in an elastic job.

    ``initial_peers`` is cluster version 1 on the serving launcher (empty on
    the others: they read it from the config service). ``hosts`` are the
    hosts and slots joiners may use (serving launcher only; the discovery
    script may change them later). ``port_range`` None: one host with
    kernel-chosen ports. ``secret`` is left out of ``repr``.
    """

    serves: bool
    config_host: str
    config_port: int  # 0: any free port (single host without --config-server)
    self_host: str
    initial_peers: list[Peer]
    hosts: list[HostSlots]
    port_range: PortRange | None
    min_np: int
    max_np: int
    replace_crashed: bool
    discovery_script: Path | None
    join_timeout: float
    admit_window: float
    command: list[str]
    topology: str
    timeout: int
    job_id: str
    logdir: Path | None
    quiet: bool
    secret: str = field(repr=False)
    # --config-store / KUNGFU_CONFIG_STORE: etcd endpoints holding the job's
    # state; every launcher then serves its own host's workers (serves is
    # True everywhere, config_host is this host).
    config_store: tuple[str, ...] = ()
    # its TLS material and etcd credentials (None: plain, no authentication)
    config_store_security: EtcdSecurity | None = field(default=None, repr=False)

    @property
    def config_address(self) -> str:
        """``host:port`` of the config service (for the serving launcher: once it listens)."""
        return f"{self.config_host}:{self.config_port}"

    def served_at(self, port: int) -> ElasticPlan:
        """This plan with the port the config service actually listens on."""
        return replace(self, config_port=port)


def build_elastic_plan(options: LaunchOptions, environ: Mapping[str, str]) -> ElasticPlan:
    """Decide whether this launcher serves, and place the initial workers if it does.

    Raises:
        LaunchError: the discovery script fails or prints no host, the
            workers or ``--max-np`` do not fit the slots, a multi-host job
            lacks ``--config-server``, this host cannot be identified, a
            port is unusable, or the secret or run id is missing
            (multi-host) or malformed.
    """
    store_text = options.config_store
    store_source = "--config-store"
    if store_text is None and environ.get(CONFIG_STORE_ENV, "").strip():
        store_text, store_source = environ[CONFIG_STORE_ENV], CONFIG_STORE_ENV
    if store_text is not None:
        if options.config_server is not None:
            raise LaunchError(
                f"give either --config-server or {store_source}, not both (with {store_source} "
                "every launcher serves its own host's workers)"
            )
        if options.discovery_script is not None:
            raise LaunchError(f"--host-discovery-script is not supported with {store_source} (give -H)")
        store = parse_config_store(store_text, store_source)
        security = resolve_store_security(
            tls=uses_tls(store_text), options=options.config_store_security, environ=environ
        )
        return replace(_store_plan(options, environ, store), config_store_security=security)
    min_np = options.min_np if options.min_np is not None else 1
    max_np = options.max_np if options.max_np is not None else options.np
    config_host = options.config_server.rpartition(":")[0] if options.config_server is not None else None
    if options.discovery_script is not None and options.self_host not in (None, config_host):
        # Another host's launcher: the serving one places every worker, and
        # the script may not even run here (nor list this host yet).
        hosts = []
    elif options.discovery_script is not None:
        hosts = run_discovery_script(options.discovery_script)
        if not hosts:
            raise LaunchError(f"--host-discovery-script {options.discovery_script} printed no host")
    else:
        # A single host gets room for every worker the job may grow to.
        hosts = options.hosts or [HostSlots(LOCALHOST, max_np)]
        total = sum(h.slots for h in hosts)
        if max_np > total:
            listing = ",".join(f"{h.host}:{h.slots}" for h in hosts)
            raise LaunchError(f"--max-np {max_np} exceeds the {total} slots of -H {listing}")
    host_names = [h.host for h in hosts]

    if config_host is None:
        if len(hosts) > 1 or options.discovery_script is not None:
            raise LaunchError(
                "an elastic job on several hosts needs --config-server HOST:PORT on every "
                f"launcher (HOST: the host that serves it, e.g. {host_names[0]}:7000)"
            )
        config_host, config_port = host_names[0], 0
    else:
        assert options.config_server is not None  # config_host came from it
        config_port = int(options.config_server.rpartition(":")[2])
    # The launcher on the config host serves: that host must be a worker
    # host, named as the hosts name it (every launcher compares names).
    if host_names and config_host not in host_names:
        raise LaunchError(
            f"--config-server host {config_host} is not one of the hosts ({', '.join(host_names)}); "
            "name it as -H or the discovery script does: its launcher serves the config service"
        )
    self_host = _self_host(host_names, options.self_host, config_host, options.discovery_script is not None)
    serves = self_host == config_host
    # Every launcher but the serving one must share the secret and run id
    # with it, which only works when they are exported.
    multi_host = len(hosts) > 1 or not serves or options.discovery_script is not None
    secret = resolve_job_secret(environ, multi_host)
    job_id = resolve_job_id(environ, multi_host)
    port_range = options.port_range
    if multi_host and port_range is None:
        port_range = parse_port_range(DEFAULT_PORT_RANGE)

    initial_peers: list[Peer] = []
    if serves:
        placements = place_workers(hosts, options.np)
        if port_range is None:
            ports = find_free_ports(self_host, len(placements))
            initial_peers = [Peer(p.rank, p.host, ports[p.local_index]) for p in placements]
        else:
            initial_peers = assign_range_ports(placements, port_range.first, port_range.last)
            check_ports_free(self_host, [p.port for p in initial_peers if p.host == self_host])

    return plan_with_options(
        options,
        serves=serves,
        config_host=config_host,
        config_port=config_port,
        self_host=self_host,
        initial_peers=initial_peers,
        hosts=hosts,
        port_range=port_range,
        min_np=min_np,
        max_np=max_np,
        discovery_script=options.discovery_script,
        job_id=job_id,
        secret=secret,
    )


def _store_plan(options: LaunchOptions, environ: Mapping[str, str], store: tuple[str, ...]) -> ElasticPlan:
    """Every launcher of a job with a config store places the initial workers
    alike (the same -H and -np everywhere) and serves its own host's workers;
    the first to reach the store commits them as version 1."""
    min_np = options.min_np if options.min_np is not None else 1
    max_np = options.max_np if options.max_np is not None else options.np
    hosts = options.hosts or [HostSlots(LOCALHOST, max_np)]
    total = sum(h.slots for h in hosts)
    if max_np > total:
        listing = ",".join(f"{h.host}:{h.slots}" for h in hosts)
        raise LaunchError(f"--max-np {max_np} exceeds the {total} slots of -H {listing}")
    self_host = choose_self_host([h.host for h in hosts], options.self_host)
    # Launchers share the job through the store: the secret seals its records.
    secret = resolve_job_secret(environ, True)
    job_id = resolve_job_id(environ, True)
    port_range = options.port_range or parse_port_range(DEFAULT_PORT_RANGE)
    initial_peers = assign_range_ports(place_workers(hosts, options.np), port_range.first, port_range.last)
    check_ports_free(self_host, [p.port for p in initial_peers if p.host == self_host])
    return plan_with_options(
        options,
        serves=True,
        config_host=self_host,
        config_port=0,
        self_host=self_host,
        initial_peers=initial_peers,
        hosts=hosts,
        port_range=port_range,
        min_np=min_np,
        max_np=max_np,
        discovery_script=None,
        job_id=job_id,
        secret=secret,
        config_store=store,
    )


def plan_with_options(options: LaunchOptions, **placement: Any) -> ElasticPlan:
    """The plan of ``placement`` (where workers and the job's state live,
    secret, id) with the options that every launcher takes as given."""
    return ElasticPlan(
        replace_crashed=options.replace_crashed,
        join_timeout=options.join_timeout,
        admit_window=options.admit_window,
        command=options.command,
        topology=options.topology,
        timeout=options.timeout,
        logdir=options.logdir,
        quiet=options.quiet,
        **placement,
    )


def _self_host(hosts: list[str], requested: str | None, config_host: str, discovering: bool) -> str:
    """Which host this launcher runs on.

    With a discovery script, a host that it does not list yet (one that is
    added later) may run a launcher: ``--self`` then needs not be listed.
    """
    if discovering and requested is not None and requested != config_host:
        return requested
    return choose_self_host(hosts, requested)
