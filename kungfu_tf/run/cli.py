"""Command-line syntax of ``kungfu-run`` and per-option validation."""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.placement import HostSlots, parse_hosts
from kungfu_tf.run.ports import DEFAULT_PORT_RANGE, PortRange, parse_port_range
from kungfu_tf.run.topology import DEFAULT_TOPOLOGY, TOPOLOGIES, normalize_topology
from kungfu_tf.run.worker_env import MAX_TIMEOUT_SECONDS

DEFAULT_TIMEOUT = 120


@dataclass(frozen=True)
class LaunchOptions:
    """Validated command line.

    ``hosts`` is None without ``-H``; ``port_range`` is None unless
    ``--port-range`` was given, because only an explicit range disables
    picking free ports on a single host.
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
        f"{MAX_TIMEOUT_SECONDS}), passed as KUNGFU_TIMEOUT (default {DEFAULT_TIMEOUT})",
    )
    parser.add_argument(
        "--logdir",
        type=Path,
        metavar="DIR",
        help="also write each rank's output to DIR/rank-<r>.log",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not echo worker output (logs are still written)",
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
    command = list(ns.command)
    # REMAINDER keeps a separating "--"; it is not part of the program.
    if command and command[0] == "--":
        command = command[1:]
    try:
        if not command:
            raise LaunchError("missing PROGRAM to run")
        if ns.np < 1:
            raise LaunchError(f"-np must be at least 1, got {ns.np}")
        if not 1 <= ns.timeout <= MAX_TIMEOUT_SECONDS:
            raise LaunchError(
                f"--timeout must be 1..{MAX_TIMEOUT_SECONDS} seconds, got {ns.timeout}"
            )
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
            command=program_command(command),
        )
    except LaunchError as e:
        parser.error(str(e))
        raise  # unreachable: parser.error exits; keeps type checkers happy


def program_command(command: Sequence[str]) -> list[str]:
    """Prefix Python scripts with this interpreter so they run in the same
    virtualenv even without a shebang or the executable bit."""
    if command[0].endswith(".py"):
        return [sys.executable, *command]
    return list(command)
