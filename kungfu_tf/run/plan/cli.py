"""Command-line syntax of ``kungfu-run`` and per-option validation."""

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.config_store_security import STORE_SECURITY_ENV
from kungfu_tf.run.plan.ports import DEFAULT_PORT_RANGE, PortRange, parse_port_range
from kungfu_tf.run.plan.topology import DEFAULT_TOPOLOGY, TOPOLOGIES, normalize_topology
from kungfu_tf.run.worker_env.placement import HostSlots, parse_hosts
from kungfu_tf.run.worker_env.worker_env import MAX_TIMEOUT_SECONDS

DEFAULT_TIMEOUT = 120
# Seconds a joiner may take from its placement to READY: a TensorFlow joiner
# imports TF, builds the model and traces its step first, which can be slow.
DEFAULT_JOIN_TIMEOUT = 600.0
# Seconds a READY joiner waits for the other joiners of its growth, so that
# they are admitted in one cluster version. Every version costs the members
# a state sync and 0.1-0.6 s of idle time, while waiting costs them nothing
# (they train while joiners warm up). Joiners placed together finished
# their warm-up (Python, TF, model, tracing: 13-27 s) within 2.5 s of each
# other in benchmarks/elastic/run.py runs on 2 busy cores; 5 s covers twice that
# spread, and a joiner that is much slower (or hangs) delays the others by
# at most 5 s, a fraction of a warm-up.
DEFAULT_ADMIT_WINDOW = 5.0


@dataclass(frozen=True)
class LaunchOptions:
    """Validated command line.

    ``hosts`` is None without ``-H``; ``port_range`` is None unless
    ``--port-range`` was given, because only an explicit range disables
    picking free ports on a single host.

    Elastic jobs (``--elastic`` or ``--min-np``): ``min_np``/``max_np`` are
    ``tf_startup_logs`` is ``--tf-startup-logs``; ``status_every`` the
    ``--status-every`` seconds (0: no job status);
    the bounds on the cluster size (None when not given); ``replace_crashed``
    is ``--elastic`` (crashed workers are replaced by joiners);
    ``config_server`` is the ``--config-server`` ``host:port``;
    ``config_store`` the ``--config-store`` value (checked with the plan,
    which also reads ``KUNGFU_CONFIG_STORE``); ``config_store_security``
    its TLS and user options, by option name (config_store_security.py);
    ``discovery_script`` the ``--host-discovery-script``; ``join_timeout``
    the ``--join-timeout`` seconds a joiner may stay STARTING;
    ``admit_window`` the ``--admit-window`` seconds READY joiners wait for
    the others of their growth; ``bind_to`` the ``--bind-to`` choice (None:
    the workers read ``KUNGFU_BIND_TO`` as the user set it).
    """

    np: int
    hosts: list[HostSlots] | None
    self_host: str | None
    port_range: PortRange | None
    topology: str
    timeout: int
    logdir: Path | None
    quiet: bool
    command: list[str]
    tf_startup_logs: bool = False
    status_every: float = 30.0
    replace_crashed: bool = False
    min_np: int | None = None
    max_np: int | None = None
    config_server: str | None = None
    config_store: str | None = None
    config_store_security: dict[str, str | Path | None] = field(default_factory=dict)
    discovery_script: Path | None = None
    join_timeout: float = DEFAULT_JOIN_TIMEOUT
    admit_window: float = DEFAULT_ADMIT_WINDOW
    ray_address: str | None = None
    ray_cpus_per_worker: float = 1.0
    bind_to: str | None = None

    @property
    def elastic(self) -> bool:
        """The cluster may change while the job runs (``--elastic`` or ``--min-np``)."""
        return self.replace_crashed or self.min_np is not None

    @property
    def on_ray(self) -> bool:
        """Workers run as Ray actors (``--ray ADDRESS``)."""
        return self.ray_address is not None


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kungfu-run",
        description="Start the workers of a KungFu training job.",
        epilog=(
            "Multi-host: run the same command (same -H) once on every host, "
            "(--self HOST names it if auto-detection fails), after exporting the same "
            "KUNGFU_JOB_SECRET (64 hex chars) and the same KUNGFU_JOB_ID (new for "
            "each run) on all of them."
        ),
        # Abbreviations would let e.g. "-n" silently mean "-np".
        allow_abbrev=False,
    )
    parser.add_argument(
        "-np", type=int, required=True, metavar="N", help="total number of workers"
    )
    parser.add_argument(
        "-H",
        dest="hosts",
        metavar="HOST:SLOTS,...",
        help="hosts and their slots, filled in order "
        "(default: all workers on 127.0.0.1)",
    )
    parser.add_argument(
        "--self",
        dest="self_host",
        metavar="HOST",
        help="which -H host this is (default: the first "
        "-H host that is a local address)",
    )
    parser.add_argument(
        "--port-range",
        metavar="A-B",
        help="worker j of each host listens on port A+j "
        f"(default {DEFAULT_PORT_RANGE}; on a single host "
        "free ports are picked instead)",
    )
    parser.add_argument(
        "--topology",
        default=DEFAULT_TOPOLOGY,
        help=f"one of {', '.join(TOPOLOGIES)} (default {DEFAULT_TOPOLOGY})",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=DEFAULT_TIMEOUT,
        metavar="S",
        help="runtime timeout in whole seconds (1.."
        f"{MAX_TIMEOUT_SECONDS}), passed as KUNGFU_TIMEOUT (default {DEFAULT_TIMEOUT}); with --config-store, "
        "also how long a launcher waits for another host's launcher to register before its workers are "
        "replaced",
    )
    parser.add_argument(
        "--bind-to",
        choices=("none", "core"),
        help="core: pin each worker of a host to its own core (sets KUNGFU_BIND_TO for the "
        "workers; default: $KUNGFU_BIND_TO, else none)",
    )
    parser.add_argument(
        "--logdir",
        type=Path,
        metavar="DIR",
        help="also write each rank's output to DIR/rank-<r>.log",
    )
    parser.add_argument(
        "--tf-startup-logs",
        action="store_true",
        help="echo the workers' TensorFlow start-up notices (absl, oneDNN, CPU "
        "instructions), hidden by default unless TF_CPP_MIN_LOG_LEVEL is set; "
        "--logdir files always keep them",
    )
    parser.add_argument(
        "--status-every",
        type=float,
        default=30.0,
        metavar="S",
        help="print the job's status (cluster version and size, step and steps/s of an "
        "elastic job, elapsed time) every S seconds (default 30; 0: never); on a "
        "terminal, one line at the bottom is rewritten in place instead",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not echo worker output (logs are still written)",
    )
    elastic = parser.add_argument_group(
        "elastic jobs",
        "The cluster may shrink (crashes, resize) and grow (resize) while the job "
        "runs; the launcher serves the config service that holds the membership.",
    )
    elastic.add_argument(
        "--elastic",
        action="store_true",
        help="start a joiner in place of every crashed worker, and joiners when "
        "the workers ask for more (up to --max-np)",
    )
    elastic.add_argument(
        "--min-np",
        type=int,
        metavar="A",
        help="survive crashes down to A workers; fewer ends the job with an error "
        "(default 1 with --elastic; without --elastic crashed workers are not replaced)",
    )
    elastic.add_argument(
        "--max-np",
        type=int,
        metavar="B",
        help="the cluster never grows beyond B workers (needs --elastic; default -np)",
    )
    elastic.add_argument(
        "--config-server",
        metavar="HOST:PORT",
        help="where the config service is (needed on several hosts: give the same "
        "value to every launcher; the one on HOST serves it on PORT and places "
        "every joiner, the others connect to it; default on one host: a free port)",
    )
    elastic.add_argument(
        "--config-store",
        metavar="etcd://HOST:PORT,...",
        help="keep the job's state in this etcd cluster instead of one launcher's "
        "config service (default: $KUNGFU_CONFIG_STORE, else none): every launcher "
        "serves its own host's workers, and the job survives the loss of any "
        "launcher's host; give the same value to every launcher; etcds://... for TLS",
    )
    for option, metavar, text in (
        ("--config-store-ca", "FILE", "PEM CA certificate(s) that verify the etcd members (etcds://)"),
        ("--config-store-cert", "FILE", "this launcher's PEM certificate, for etcd's --client-cert-auth"),
        ("--config-store-key", "FILE", "the PEM private key of --config-store-cert"),
        ("--config-store-user", "NAME", "etcd user; password: $KUNGFU_CONFIG_STORE_PASSWORD or the next option"),
        ("--config-store-password-file", "FILE", "a file whose first line is the etcd user's password"),
    ):
        elastic.add_argument(
            option, metavar=metavar, help=f"{text} (default: ${STORE_SECURITY_ENV[option]})"
        )
    elastic.add_argument(
        "--host-discovery-script",
        type=Path,
        metavar="PATH",
        help="instead of -H: a program printing one host:slots line per available "
        "host, run every few seconds (needs --elastic); workers of a host that "
        "disappears are evicted, slots of new hosts are used for joiners",
    )
    elastic.add_argument(
        "--join-timeout",
        type=float,
        metavar="S",
        help="withdraw (and stop) a joiner that is not ready S seconds after it "
        "was placed, and place another; three such failures in a row end the "
        f"tries (needs --elastic; default {DEFAULT_JOIN_TIMEOUT:g})",
    )
    elastic.add_argument(
        "--admit-window",
        type=float,
        metavar="S",
        help="a joiner that is ready waits up to S seconds for the other joiners "
        "of its growth, so that all are admitted in one cluster version (each "
        "version costs the members a state sync); 0 admits each joiner as soon "
        f"as it is ready (needs --elastic; default {DEFAULT_ADMIT_WINDOW:g})",
    )
    ray = parser.add_argument_group(
        "Ray",
        "Run every worker as a subprocess of its own Ray actor (one placement group "
        "each) on a Ray cluster; this launcher serves the config service. Needs "
        "Ray Core: pip install kungfu_tf[ray].",
    )
    ray.add_argument(
        "--ray",
        dest="ray_address",
        metavar="ADDRESS",
        help="the Ray cluster's head (GCS) HOST:PORT, or auto; with --elastic, "
        "joiners ask Ray's autoscaler for room",
    )
    ray.add_argument(
        "--ray-cpus-per-worker",
        type=float,
        metavar="C",
        help="CPUs of each worker's placement group (needs --ray; default 1)",
    )
    parser.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="PROGRAM ARGS...",
        help="program to run; *.py is run with this Python",
    )
    return parser


def parse_args(argv: Sequence[str] | None = None) -> LaunchOptions:
    """Parse and validate ``argv`` (default ``sys.argv[1:]``).

    Raises:
        SystemExit: with status 2 and a usage message on any error, as
            argparse does (status 0 for ``--help``).
    """
    parser = _build_parser()
    ns = parser.parse_args(argv)
    try:
        return options_from_namespace(ns)
    except LaunchError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits; keeps type checkers happy


def parse_args_or_raise(argv: Sequence[str]) -> LaunchOptions:
    """As :func:`parse_args`, but a bad value raises instead of exiting (for Python callers).

    Raises:
        LaunchError: naming the option and its value.
    """
    return options_from_namespace(_build_parser().parse_args(argv))


def options_from_namespace(ns: argparse.Namespace) -> LaunchOptions:
    """Check the parsed options.

    Raises:
        LaunchError: naming the option and its value.
    """
    command = list(ns.command)
    # REMAINDER keeps a separating "--"; it is not part of the program.
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise LaunchError("missing PROGRAM to run")
    if ns.np < 1:
        raise LaunchError(f"-np must be at least 1, got {ns.np}")
    if not 1 <= ns.timeout <= MAX_TIMEOUT_SECONDS:
        raise LaunchError(
            f"--timeout must be 1..{MAX_TIMEOUT_SECONDS} seconds, got {ns.timeout}"
        )
    if not (0 <= ns.status_every < float("inf")):
        raise LaunchError(f"--status-every must be a number of seconds >= 0, got {ns.status_every}")
    _check_elastic_options(ns)
    _check_ray_options(ns)
    return LaunchOptions(
        np=ns.np,
        hosts=parse_hosts(ns.hosts) if ns.hosts is not None else None,
        self_host=ns.self_host,
        port_range=(
            parse_port_range(ns.port_range) if ns.port_range is not None else None
        ),
        topology=normalize_topology(ns.topology),
        timeout=ns.timeout,
        logdir=ns.logdir,
        quiet=ns.quiet,
        tf_startup_logs=ns.tf_startup_logs,
        status_every=ns.status_every,
        command=program_command(command),
        replace_crashed=ns.elastic,
        min_np=ns.min_np,
        max_np=ns.max_np,
        config_server=(
            parse_config_server(ns.config_server)
            if ns.config_server is not None
            else None
        ),
        config_store=ns.config_store,
        config_store_security={o: getattr(ns, o[2:].replace("-", "_")) for o in STORE_SECURITY_ENV},
        discovery_script=ns.host_discovery_script,
        join_timeout=(
            ns.join_timeout
            if ns.join_timeout is not None
            else DEFAULT_JOIN_TIMEOUT
        ),
        admit_window=(
            ns.admit_window
            if ns.admit_window is not None
            else DEFAULT_ADMIT_WINDOW
        ),
        ray_address=ns.ray_address,
        ray_cpus_per_worker=(
            ns.ray_cpus_per_worker if ns.ray_cpus_per_worker is not None else 1.0
        ),
        bind_to=ns.bind_to,
    )


def _check_ray_options(ns: argparse.Namespace) -> None:
    """``--ray`` places the workers itself: the options that place them locally do not apply."""
    if ns.ray_address is None:
        if ns.ray_cpus_per_worker is not None:
            raise LaunchError(f"--ray-cpus-per-worker {ns.ray_cpus_per_worker:g} needs --ray")
        return
    if not ns.ray_address.strip():
        raise LaunchError("--ray needs the Ray cluster's address HOST:PORT (or auto), got ''")
    for value, option in (
        (ns.hosts, "-H"),
        (ns.self_host, "--self"),
        (ns.port_range, "--port-range"),
        (ns.config_server, "--config-server"),
        (ns.config_store, "--config-store"),
        (ns.host_discovery_script, "--host-discovery-script"),
    ):
        if value is not None:
            raise LaunchError(f"{option} {value} does not apply with --ray {ns.ray_address} (Ray places the workers)")
    cpus = ns.ray_cpus_per_worker
    if cpus is not None and (not math.isfinite(cpus) or cpus <= 0):
        raise LaunchError(f"--ray-cpus-per-worker must be a number of CPUs > 0, got {cpus:g}")


def _check_elastic_options(ns: argparse.Namespace) -> None:
    """The elastic options are consistent with each other and with ``-np``."""
    elastic = ns.elastic or ns.min_np is not None
    if ns.max_np is not None:
        if not ns.elastic:
            raise LaunchError(
                f"--max-np {ns.max_np} needs --elastic (without it no worker is ever added)"
            )
        if ns.max_np < 1:
            raise LaunchError(f"--max-np must be at least 1, got {ns.max_np}")
        if ns.np > ns.max_np:
            raise LaunchError(f"-np {ns.np} exceeds --max-np {ns.max_np}")
    if ns.min_np is not None:
        if ns.min_np < 1:
            raise LaunchError(f"--min-np must be at least 1, got {ns.min_np}")
        if ns.min_np > ns.np:
            raise LaunchError(f"--min-np {ns.min_np} exceeds -np {ns.np}")
    if ns.config_server is not None and not elastic:
        raise LaunchError(
            f"--config-server {ns.config_server} is only used by elastic jobs "
            "(--elastic or --min-np)"
        )
    for option in STORE_SECURITY_ENV:
        value = getattr(ns, option[2:].replace("-", "_"))
        if value is not None and not elastic:
            raise LaunchError(f"{option} {value} is only used by elastic jobs with --config-store")
    if ns.config_store is not None:
        if not elastic:
            raise LaunchError(f"--config-store {ns.config_store} is only used by elastic jobs (--elastic or --min-np)")
        if ns.config_server is not None:
            raise LaunchError(
                f"give either --config-server or --config-store, not both (with --config-store "
                f"{ns.config_store} every launcher serves its own host's workers)"
            )
        if ns.host_discovery_script is not None:
            raise LaunchError("--host-discovery-script is not supported with --config-store (give -H)")
    if ns.join_timeout is not None:
        if not ns.elastic:
            raise LaunchError(
                f"--join-timeout {ns.join_timeout:g} needs --elastic (without it no joiner is started)"
            )
        if not math.isfinite(ns.join_timeout) or ns.join_timeout <= 0:
            raise LaunchError(
                f"--join-timeout must be a number of seconds > 0, got {ns.join_timeout:g}"
            )
    if ns.admit_window is not None:
        if not ns.elastic:
            raise LaunchError(
                f"--admit-window {ns.admit_window:g} needs --elastic (without it no joiner is started)"
            )
        if not math.isfinite(ns.admit_window) or ns.admit_window < 0:
            raise LaunchError(
                f"--admit-window must be a number of seconds >= 0, got {ns.admit_window:g}"
            )
    if ns.host_discovery_script is not None:
        if not ns.elastic:
            raise LaunchError("--host-discovery-script needs --elastic")
        if ns.hosts is not None:
            raise LaunchError(
                "give either -H or --host-discovery-script, not both "
                "(the script says which hosts there are)"
            )


def parse_config_server(text: str) -> str:
    """Check ``--config-server HOST:PORT`` and return it.

    Example:
        >>> parse_config_server("10.0.0.1:7000")
        '10.0.0.1:7000'

    Raises:
        LaunchError: naming the value if it is not ``host:port`` with a
            port in 1..65535.
    """
    host, sep, port = text.strip().rpartition(":")
    if (
        not sep
        or not host
        or ":" in host
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
    ):
        raise LaunchError(
            f"bad --config-server {text!r}: expected HOST:PORT with port 1..65535"
        )
    return f"{host}:{int(port)}"


def program_command(command: Sequence[str]) -> list[str]:
    """Prefix Python scripts with this interpreter so they run in the same
    virtualenv even without a shebang or the executable bit."""
    if command[0].endswith(".py"):
        return [sys.executable, *command]
    return list(command)
