"""Starting the launcher's config service on a port that none of its initial workers was given.

Without ``--port-range`` the launcher picks its workers' ports by letting
the kernel choose free ones (plan/ports.py ``find_free_ports``), releases
them, and only then starts the config service on port 0: the kernel may hand
it one of those ports, and that worker then fails to listen ("Address already
in use": a worker lost before the first step). The service is started again
on another port when that happens.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol, TypeVar

# Each kernel pick is almost never one of a few planned ports: a few tries suffice.
ATTEMPTS = 8


class _Service(Protocol):
    port: int

    def start(self) -> object: ...

    def stop(self, grace: float | None = None) -> None: ...


S = TypeVar("S", bound=_Service)


def start_avoiding(make: Callable[[], S], taken: Collection[int], attempts: int = ATTEMPTS) -> S:
    """``make()`` started on a port not in ``taken`` (for services that bind port 0).

    Example:
        >>> class Fake:
        ...     picks = iter([5001, 5002])
        ...     def start(self): self.port = next(Fake.picks)
        ...     def stop(self, grace=None): pass
        >>> start_avoiding(Fake, taken={5001}).port
        5002

    Raises:
        OSError: from ``start``, or every try landed on a taken port.
    """
    for _ in range(attempts):
        service = make()
        service.start()
        if service.port not in taken:
            return service
        service.stop(0)
    raise OSError(f"every one of {attempts} ports the kernel chose was one given to a worker ({sorted(taken)})")
