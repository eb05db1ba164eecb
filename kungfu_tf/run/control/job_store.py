"""Where an elastic job's state lives: one small interface, one implementation per backend.

The membership rules live once, in :class:`~kungfu_tf.run.control.job_state.JobStateMachine`.
A store only keeps its record (``JobStateMachine.to_record``) and lets
several processes change it safely:

* :meth:`JobStore.load` answers the newest record and the version it is at;
* :meth:`JobStore.compare_and_set` writes a new record only if the store is
  still at that version (else the caller re-loads and decides again);
* :meth:`JobStore.changes` yields whenever the record may have changed
  (the watch that replaces a long poll between hosts).

Backends: the embedded config service keeps one machine in its own memory
(the default, one host: no store at all); :class:`MemoryJobStore` keeps
a record in this process (tests of the shared logic, stored_job_state.py);
kungfu_tf/run/control/etcd_job_store.py keeps it in etcd
(``kungfu-run --config-store etcd://...``), where it survives any host.

Example:
    >>> store = MemoryJobStore()
    >>> record, version = store.load()
    >>> record is None, store.compare_and_set(version, {"n": 1}), store.compare_and_set(version, {"n": 2})
    (True, True, False)
    >>> store.load()[0]
    {'n': 1}
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Protocol

__all__ = ["JobStore", "MemoryJobStore", "StoreUnavailableError"]


class StoreUnavailableError(Exception):
    """The store cannot serve now (etcd without quorum, unreachable); the message says why."""


class JobStore(Protocol):
    """A job's record with compare-and-set on its version (see the module docstring).

    Example (a change, as stored_job_state.py makes each one)::

        while True:
            record, version = store.load()
            new = apply_request(record)
            if store.compare_and_set(version, new):
                break  # else another writer came first: decide again on its record
    """

    def describe(self) -> str:
        """The store as users name it (``etcd://h1:2379,...``), for messages."""
        ...

    def load(self) -> tuple[dict | None, object]:
        """The newest valid record (None if there is none yet) and the version to compare-and-set on.

        Raises:
            StoreUnavailableError: the store cannot answer now.
        """
        ...

    def compare_and_set(self, version: object, record: dict) -> bool:
        """Write ``record`` if the store is still at ``version`` (from :meth:`load`); whether it did.

        Raises:
            StoreUnavailableError: the store cannot commit now (nothing was written).
        """
        ...

    def changes(self) -> Iterator[None]:
        """Yields when the record may have changed, until :meth:`close`."""
        ...

    def close(self) -> None:
        """Ends :meth:`changes` and gives back connections."""
        ...


class MemoryJobStore:
    """A record in this process's memory (thread-safe); versions count the writes.

    Example: see the module docstring.
    """

    def __init__(self) -> None:
        self._record: dict | None = None
        self._version = 0
        self._closed = False
        self._cond = threading.Condition()

    def describe(self) -> str:
        return "memory"

    def load(self) -> tuple[dict | None, object]:
        with self._cond:
            return copy.deepcopy(self._record), self._version

    def compare_and_set(self, version: object, record: dict) -> bool:
        with self._cond:
            if version != self._version:
                return False
            self._record = copy.deepcopy(record)
            self._version += 1
            self._cond.notify_all()
            return True

    def changes(self) -> Iterator[None]:
        with self._cond:
            seen = self._version
        while True:
            with self._cond:
                while not self._closed and self._version == seen:
                    self._cond.wait()
                if self._closed:
                    return
                seen = self._version
            yield None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
