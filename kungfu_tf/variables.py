"""Making every worker's variables equal to one worker's: ``broadcast_variables``.

Data-parallel workers must start from identical weights (and optimizer state),
or averaging their gradients averages gradients of different models.

Example:
    >>> import tensorflow as tf
    >>> import kungfu_tf
    >>> v = tf.Variable([1.0, 2.0])
    >>> kungfu_tf.broadcast_variables([v], root=0)  # eager: assigns, returns None
    >>> v.numpy()  # one worker: unchanged
    array([1., 2.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from kungfu_tf.ops import collective


def _broadcast_value(v: Any, root: int, key: str) -> tf.Tensor:
    value = tf.convert_to_tensor(v)
    if value.dtype == tf.bool:
        # The runtime has no bool type; uint8 carries the same information.
        return tf.cast(collective.broadcast(tf.cast(value, tf.uint8), root=root, name=key), tf.bool)
    return collective.broadcast(value, root=root, name=key)


DEFAULT_NAME = "broadcast_variables"


def broadcast_variables(
    variables: Iterable[Any], root: int = 0, name: str | None = None
) -> tf.Operation | None:
    """Assigns every variable in ``variables`` the value it has on worker ``root``.

    Every worker must pass the same variables in the same order. The workers
    first check with a consensus (KungFu Alg. 1) that they all hold the same
    list of (name, shape, dtype); if not, every worker raises ``ValueError``
    (eagerly) or ``InvalidArgumentError`` (when the graph runs) naming this
    worker's variables, instead of copying one variable into another. Each
    variable then gets the explicit message key ``f"{name}/{i}/{v.name}"``, so
    keys match across workers without depending on how many other collectives
    were created before.

    Works on ``tf.Variable`` and Keras 3 variables. Eagerly, the assignments
    are done when the call returns and ``None`` is returned. Inside
    ``tf.function`` or a ``tf.compat.v1`` graph, the op grouping all
    assignments is returned (run it in a Session).

    ``name`` (the key prefix): without it, each call in one graph gets its own
    prefix from the graph's unique names (``broadcast_variables``, then
    ``broadcast_variables_<n>``, in the order of the calls, hence the same
    on every worker tracing the same program), so one ``tf.function`` may
    broadcast the model's variables and then the optimizer's. An explicit
    ``name`` is used verbatim and only once per graph.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf import broadcast_variables
        >>> w = tf.Variable(tf.random.normal([3]))   # differs per worker
        >>> broadcast_variables([w])                 # now rank 0's value everywhere
        >>> @tf.function
        ... def sync(model, optimizer):
        ...     broadcast_variables(model.variables)       # a key of its own
        ...     broadcast_variables(optimizer.variables)   # and another one
    """
    variables = list(variables)
    if name is None:
        name = _call_name()
    signature = _signature(variables)
    agreed = collective.consensus(
        tf.constant(list(signature.encode()), dtype=tf.uint8), name=f"{name}/signature"
    )
    problem = (
        "workers hold different variables for broadcast_variables: this worker has "
        f"{len(variables)}: {_summary(signature)}"
    )
    if tf.executing_eagerly():
        if not bool(agreed):
            raise ValueError(problem)
        return _assign_all(variables, root, name)
    with tf.control_dependencies([tf.debugging.Assert(agreed, [problem])]):
        return _assign_all(variables, root, name)


def _call_name() -> str:
    # Eager broadcasts complete before the next one starts, so one key serves
    # them all; in a graph every call needs its own. unique_name counts the
    # names already taken in this graph, which the same program takes in the
    # same order on every worker.
    if tf.executing_eagerly():
        return DEFAULT_NAME
    return tf.compat.v1.get_default_graph().unique_name(DEFAULT_NAME)


def _signature(variables: list[Any]) -> str:
    # What must agree across workers: names (Keras 3 paths where available),
    # shapes and dtypes, in order.
    parts = []
    for v in variables:
        label = getattr(v, "path", None) or v.name
        parts.append(f"{label}:{list(v.shape)}:{tf.as_dtype(v.dtype).name}")
    return ";".join(parts)


def _summary(signature: str, limit: int = 400) -> str:
    return signature if len(signature) <= limit else signature[:limit] + " ..."


def _assign_all(variables: list[Any], root: int, name: str) -> tf.Operation | None:
    assigns = []
    for i, v in enumerate(variables):
        key = f"{name}/{i}/{v.name}"
        new_value = _broadcast_value(v, root, key)
        assigns.append(v.assign(new_value))
    if tf.executing_eagerly():
        return None
    # In graphs, assign() returns tensors or ops; group them into one op.
    return tf.group(*[a for a in assigns if a is not None], name=name.replace("/", "_"))
