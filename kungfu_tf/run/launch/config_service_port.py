"""Starting the launcher's config service on a port that none of its initial workers was given.

Without ``--port-range`` the launcher picks its workers' ports by letting
the kernel choose free ones (plan/ports.py ``find_free_ports``), releases
them, and only then starts the config service on port 0: the kernel may hand
it one of those ports, and that worker then fails to listen ("Address already
in use": a worker lost before the first step). A fresh service is started
when that happens; the refused one never served or started its timers
(``ConfigServer.start(avoid=...)``), so a job state shared between them (the
``--config-store`` one) is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from kungfu_tf.run.control.config_server import ConfigServer, PortAvoidedError

# Each kernel pick is almost never one of a few planned ports: a few tries suffice.
ATTEMPTS = 8


def start_avoiding(make: Callable[[], ConfigServer], taken: Collection[int], attempts: int = ATTEMPTS) -> ConfigServer:
    """``make()`` (a ConfigServer on port 0) started on a port not in ``taken``.

    Example::

        server = start_avoiding(lambda: ConfigServer(0, secret=s, job_id=j, cluster=c, elastic=True), {10001})

    Raises:
        OSError: from ``start``, or every try landed on a taken port.
    """
    for _ in range(attempts):
        service = make()
        try:
            return service.start(avoid=taken)
        except PortAvoidedError:
            continue
    raise OSError(f"every one of {attempts} ports the kernel chose was one given to a worker ({sorted(taken)})")
