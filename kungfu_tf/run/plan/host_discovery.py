"""``--host-discovery-script``: which hosts (and slots) an elastic job may use.

Horovod's convention: the script prints one ``host:slots`` line per host
that is available now; a cluster manager edits what it prints. The serving
launcher runs it at start-up (the initial hosts, as ``-H`` would give them)
and then every :data:`DISCOVERY_INTERVAL` seconds in a background thread:
hosts that appear give slots for joiners, the workers of a host that
disappears are evicted.

Example:
    >>> parse_discovery_output("10.0.0.1:2\\n\\n10.0.0.2:4\\n", "hosts.sh")
    [HostSlots(host='10.0.0.1', slots=2), HostSlots(host='10.0.0.2', slots=4)]
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.worker_env.placement import HostSlots

# How often the script runs while the job runs (Horovod polls about as often).
DISCOVERY_INTERVAL = 2.0
# A script that takes longer is reported as hung (and the previous hosts kept).
SCRIPT_TIMEOUT = 10.0


def parse_discovery_output(text: str, script: str | Path) -> list[HostSlots]:
    """The hosts in the script's output, in its order; blank lines are skipped.

    Raises:
        LaunchError: naming the script, the line number and the line, for a
            line that is not ``host:slots`` with slots >= 1, a host with
            ``:`` or spaces, or a host printed twice.
    """
    hosts: list[HostSlots] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"--host-discovery-script {script}: line {number} {raw!r}"
        host, sep, slots_text = line.rpartition(":")
        if not sep or not host or ":" in host or any(c.isspace() for c in host):
            raise LaunchError(f"{where}: expected host:slots (a hostname or IPv4 address, a colon, a number)")
        if not slots_text.isdigit() or int(slots_text) < 1:
            raise LaunchError(f"{where}: slots must be a whole number >= 1, got {slots_text!r}")
        if host in seen:
            raise LaunchError(f"{where}: host {host!r} is listed twice")
        seen.add(host)
        hosts.append(HostSlots(host, int(slots_text)))
    return hosts


def run_discovery_script(script: Path, timeout: float = SCRIPT_TIMEOUT) -> list[HostSlots]:
    """Run ``script`` once and parse what it prints.

    Raises:
        LaunchError: if it cannot be started, runs longer than ``timeout``,
            exits non-zero (with the last line of its stderr) or prints
            something that is not ``host:slots`` lines.
    """
    try:
        result = subprocess.run(
            [str(script)], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False
        )
    except OSError as e:
        raise LaunchError(f"cannot run --host-discovery-script {script}: {e.strerror or e}") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"--host-discovery-script {script} did not finish within {timeout:g} s") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no error output)"])[-1]
        raise LaunchError(
            f"--host-discovery-script {script} failed with exit code {result.returncode}: {last}"
        )
    return parse_discovery_output(result.stdout, script)


class HostDiscovery:
    """Runs the script every ``interval`` seconds in a daemon thread.

    The supervisor's loop calls :meth:`take` to get what changed since it
    last looked: a new host list, or the error of the latest run (each
    distinct outcome once), so that a transient failure is reported once
    and the previous hosts stay in use.
    """

    def __init__(self, script: Path, current: Sequence[HostSlots], interval: float = DISCOVERY_INTERVAL):
        """Start polling; ``current`` is what the first run at start-up printed."""
        self._script = script
        self._interval = interval
        self._lock = threading.Lock()
        self._last: list[HostSlots] | str = list(current)
        self._pending: list[HostSlots] | str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kungfu-host-discovery", daemon=True)
        self._thread.start()

    def take(self) -> list[HostSlots] | str | None:
        """The new host list, or an error message, or None if nothing changed."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def stop(self) -> None:
        """Stop polling (a run in progress finishes in the background)."""
        self._stop.set()

    def _poll(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                outcome: list[HostSlots] | str = run_discovery_script(self._script)
                if not outcome:
                    outcome = f"--host-discovery-script {self._script} printed no host; keeping the previous hosts"
            except LaunchError as e:
                outcome = f"{e}; keeping the previous hosts"
            with self._lock:
                if outcome != self._last:
                    self._last = outcome
                    self._pending = outcome
