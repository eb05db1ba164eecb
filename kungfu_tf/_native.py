"""Loads the kungfu_tf op library once; the only path from Python to C++."""

from __future__ import annotations

import functools
import os
from types import ModuleType

LIBRARY_NAME = "libkungfu_tf.so"


@functools.cache
def library() -> ModuleType:
    """The generated op wrappers of libkungfu_tf.so (``kungfu_all_reduce``, ...).

    Raises:
        WorkerEnvError: if a ``KUNGFU_*`` variable the runtime will read is
            malformed; checked here, before any op runs, so the worker stops
            at start-up with the variable's name rather than at its first op.
    """
    import tensorflow as tf

    from kungfu_tf.run.worker_env import read_worker_env

    read_worker_env(os.environ)

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if not os.path.exists(path):
        raise ImportError(
            f"{path} is missing: build it with 'make install' (or 'pip install .') "
            "from the kungfu_tf source tree"
        )
    return tf.load_op_library(path)
