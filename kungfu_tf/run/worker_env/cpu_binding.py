"""Pinning each worker of a host to its own core: ``KUNGFU_BIND_TO=core`` (``kungfu-run --bind-to core``).

Unpinned, a 4-byte all-reduce in a ``tf.function`` between two workers on
the 2-core test machine ran at either ~90 µs or ~200 µs per call and kept
one speed for thousands of calls, depending on where the scheduler put the
two processes' threads: 47 of 180 loops of 1,000 calls were slow. Pinned
one process per core, 1 of 180 was (docs/guide/benchmarks.md, "The dispatch
floor measured in the workers"). Open MPI binds ranks to cores by default
for the same reason.

The worker pins itself when the op library loads (kungfu_tf/_native.py), so
the binding holds however it was started (kungfu-run, elastic, Ray, mpirun):
every thread of the process then (TensorFlow's, started at its import) and
every thread started later, which inherits its creator's mask. Its core is
the ``i``-th of the cores it may run on, ``i`` its place among the peers of
``KUNGFU_PEERS`` on its own host (wrapping round when a host has more
workers than cores). A joiner of an elastic job knows no peer but itself
and stays unpinned. A shrink and a later growth may give two workers of a
host the same core; nothing re-pins them.

Example:
    >>> core_for(1, {0, 1, 2, 3}), core_for(5, {2, 3})
    (1, 3)
    >>> local_index(["10.0.0.1:100", "10.0.0.2:100", "10.0.0.1:101"], "10.0.0.1:101")
    1
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from kungfu_tf.run.worker_env.worker_env import (
    JOINER_ENV,
    PEERS_ENV,
    SELF_ENV,
    WorkerEnvError,
)

BIND_ENV = "KUNGFU_BIND_TO"
BIND_CHOICES = ("none", "core")


def core_for(local: int, allowed: Iterable[int]) -> int:
    """The core of the worker with this place among its host's workers."""
    cores = sorted(allowed)
    return cores[local % len(cores)]


def local_index(peers: Sequence[str], me: str) -> int:
    """``me``'s place among the ``host:port`` peers of its own host."""
    host = me.rpartition(":")[0]
    return [p for p in peers if p.rpartition(":")[0] == host].index(me)


def binding_mode(environ: Mapping[str, str]) -> str:
    """``none`` or ``core``; WorkerEnvError naming the variable for anything else."""
    value = environ.get(BIND_ENV, "") or "none"
    if value not in BIND_CHOICES:
        raise WorkerEnvError(f"{BIND_ENV} must be one of {', '.join(BIND_CHOICES)}, got {value!r}")
    return value


def apply_cpu_binding(environ: Mapping[str, str]) -> int | None:
    """Pins every thread of this process to its core (``KUNGFU_BIND_TO=core``); returns the core, or None."""
    if binding_mode(environ) == "none" or environ.get(JOINER_ENV) == "1":
        return None
    peers = [p for p in environ.get(PEERS_ENV, "").split(",") if p]
    me = environ.get(SELF_ENV, "")
    if me not in peers:  # a process that is no worker of a job (checked apart by read_worker_env)
        return None
    core = core_for(local_index(peers, me), os.sched_getaffinity(0))
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), {core})
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return core
