"""kungfu_tf: adaptive distributed training for TensorFlow 2.

Launch N workers with ``kungfu-run -np N python train.py``; inside, use the
collectives in :mod:`kungfu_tf.ops` and the Python helpers below. Without the
launcher a script runs as a one-worker cluster.

Example:
    >>> import kungfu_tf
    >>> kungfu_tf.rank(), kungfu_tf.size()
    (0, 1)

TensorFlow is imported only when an op is first needed, so importing the
package (and running the ``kungfu-run`` launcher) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY_SUBMODULES = ("data", "elastic", "keras", "ops", "v1")
# Names users of Horovod find at the top level (``hvd.DistributedGradientTape``),
# imported from the module that defines them when first used.
_LAZY_ATTRIBUTES = {"DistributedGradientTape": "kungfu_tf.optimizers"}


def rank() -> int:
    """This worker's rank (0 .. size()-1).

    On a joiner of an elastic job not admitted yet: a plain process waits
    for its admission first; one warming up for ``ElasticState.join`` gets
    the number of members (its rank if admitted now: never 0).
    """
    from kungfu_tf.ops import config

    return config.current_int(config.rank)


def size() -> int:
    """Number of workers in the cluster (on a joiner warming up for ``ElasticState.join``: the members + 1)."""
    from kungfu_tf.ops import config

    return config.current_int(config.cluster_size)


def local_rank() -> int:
    """This worker's position among the workers on its host."""
    from kungfu_tf.ops import config

    return config.current_int(config.local_rank)


def local_size() -> int:
    """Number of workers on this worker's host."""
    from kungfu_tf.ops import config

    return config.current_int(config.local_size)


def detached() -> bool:
    """Whether this worker has left its elastic job (a ``resize`` applied a cluster without it); KungFu's name.

    Example:
        >>> import kungfu_tf
        >>> kungfu_tf.detached()   # not elastic: never
        False
    """
    from kungfu_tf.ops import elastic_membership

    return elastic_membership.detached()


def broadcast_variables(variables: Any, root: int = 0, name: str | None = None) -> Any:
    """Assigns every variable root's value; see :func:`kungfu_tf.variables.broadcast_variables`.

    Example:
        >>> import tensorflow as tf
        >>> import kungfu_tf
        >>> kungfu_tf.broadcast_variables([tf.Variable(1.0)], root=0)  # eager: None
    """
    from kungfu_tf.variables import broadcast_variables as impl

    return impl(variables, root=root, name=name)


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"kungfu_tf.{name}")
    if name in _LAZY_ATTRIBUTES:
        return getattr(importlib.import_module(_LAZY_ATTRIBUTES[name]), name)
    raise AttributeError(f"module 'kungfu_tf' has no attribute {name!r}")


__all__ = ["DistributedGradientTape", "__version__", "broadcast_variables", "detached", "local_rank", "local_size", "ops", "rank", "size"]
