"""Loads the kungfu_tf op library once; the only path from Python to C++."""

from __future__ import annotations

import atexit
import functools
import gc
import os
from types import ModuleType

LIBRARY_NAME = "libkungfu_tf.so"


def skip_exit_collection() -> None:
    """Keeps the interpreter's final garbage collections away from the objects alive now.

    At exit CPython tears the modules down and runs the cyclic garbage
    collector over what is left: with TensorFlow loaded that is ~1.2 CPU
    seconds per worker (measured with perf: gc_collect_main), which several
    workers finishing together on a loaded host stretch to 5-10 s of wall
    time between a worker's last line and its exit. Freezing moves every
    object to the collector's permanent generation, which it never scans;
    memory is returned with the process, and Python does not promise
    ``__del__`` of objects still alive at exit anyway. Registered (atexit)
    when the op library is loaded, so it runs before the atexit handlers
    registered earlier (TF's, logging's), which still run normally.

    Example::

        atexit.register(skip_exit_collection)
    """
    gc.freeze()


@functools.cache
def library() -> ModuleType:
    """The generated op wrappers of libkungfu_tf.so (``kungfu_all_reduce``, ...).

    A process that ``mpirun`` or ``srun`` started (no ``KUNGFU_PEERS``)
    first gets the ``KUNGFU_*`` variables derived from the launcher's
    (:mod:`kungfu_tf.run.worker_env.external_launch`), which the runtime reads when
    the library loads.

    With ``KUNGFU_BIND_TO=core`` the worker is pinned to its own core
    first (:mod:`kungfu_tf.run.worker_env.cpu_binding`).

    Raises:
        WorkerEnvError: if a ``KUNGFU_*`` variable the runtime will read is
            malformed, or a launcher's variable they are derived from is;
            checked here, before any op runs, so the worker stops at
            start-up with the variable's name rather than at its first op.
    """
    import tensorflow as tf

    from kungfu_tf.run.worker_env.cpu_binding import apply_cpu_binding
    from kungfu_tf.run.worker_env.external_launch import apply_external_launch
    from kungfu_tf.run.worker_env.worker_env import read_worker_env

    apply_external_launch(os.environ)
    read_worker_env(os.environ)
    apply_cpu_binding(os.environ)  # before the runtime starts its threads: they inherit the core

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if not os.path.exists(path):
        raise ImportError(
            f"{path} is missing: build it with 'make install' (or 'pip install .') "
            "from the kungfu_tf source tree"
        )
    loaded = tf.load_op_library(path)
    atexit.register(skip_exit_collection)
    return loaded
