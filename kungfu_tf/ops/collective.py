"""Collective operations over all workers.

Every function works eagerly, inside ``tf.function`` and in ``tf.compat.v1``
graphs. ``name`` is the message key that matches this call across workers (see
:mod:`kungfu_tf.ops._keys`).

Limits: ``all_reduce``, ``broadcast``, ``reduce`` and ``all_gather`` take
tensors of at most 8 dimensions (the message header carries the shape so
that peers can compare it; reshape first), ``group_all_reduce`` any (it
sends one fused 1-D buffer). Names are at most 1024 bytes (UTF-8) without
``'\\x00'`` or ``'\\x01'``. A violation raises ValueError in Python or
InvalidArgumentError from the kernel, before anything is sent.

Unused results: the data collectives are stateless ops (so that TF does not
serialise them), and Grappler turns a stateless op whose outputs feed only
control edges into a NoOp. A collective whose result one worker does not use
(a non-root's :func:`reduce`, say) must still run there, or its peers wait
for it until their timeout: pass such results to :func:`keep_alive`, and
put the op it returns in the step's dependencies. A control dependency on the
collective alone is not enough.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf import ops
    >>> ops.all_reduce(tf.constant([1.0, 2.0]), op="mean").numpy()  # one worker
    array([1., 2.], dtype=float32)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import SupportsIndex, cast

import numpy as np
import tensorflow as tf

from kungfu_tf._native import library
from kungfu_tf.ops._keys import message_key
from kungfu_tf.ops.config import topology_name

REDUCE_OPS = ("sum", "min", "max", "prod", "mean")


def _no_admission() -> None:
    pass


# Run before every collective. A joiner that is a plain process enters the
# cluster at its first collective (kungfu_tf/ops/plain_joiner.py; elsewhere
# one flag test); plain_joiner sits above this module (it agrees on versions
# with all_reduce), so kungfu_tf/ops/__init__.py installs it here.
_admission_check: Callable[[], None] = _no_admission


def set_admission_check(check: Callable[[], None]) -> None:
    """Installs what every collective calls first (kungfu_tf/ops/__init__.py: ``plain_joiner.admit_if_plain``)."""
    global _admission_check
    _admission_check = check


def _admitted() -> None:
    _admission_check()


def _check_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"op must be one of {', '.join(REDUCE_OPS)}; got {op!r}")


def _root_rank(root: object, what: str) -> int:
    """``root`` as a rank (an int >= 0), or TypeError/ValueError naming it.

    The runtime takes the root as an op attribute, so it must be known when
    the op is built: a Python or numpy integer, or a tensor whose value TF can
    compute then (a constant). Floats are refused rather than truncated
    (``root=1.9`` is a mistake, not rank 1), and so are bools.
    """
    value = root
    if isinstance(root, (tf.Tensor, tf.Variable, np.ndarray)):
        value = tf.get_static_value(root) if not isinstance(root, np.ndarray) else root
        if value is None:
            raise TypeError(
                f"{what}: root must be known when the op is built (it is an op attribute), "
                f"got a tensor computed at run time: {root!r}"
            )
        value = np.asarray(value)
        if value.ndim != 0 or value.dtype.kind not in "iu":
            raise TypeError(f"{what}: root must be an integer scalar, got {root!r}")
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what}: root must be a rank (an int), got the bool {root!r}")
    try:
        rank = operator.index(cast(SupportsIndex, value))  # ints and numpy integers, not floats (checked here)
    except TypeError:
        raise TypeError(f"{what}: root must be a rank (an int), got {root!r}") from None
    if rank < 0:
        raise ValueError(f"{what}: root must be a rank (>= 0), got {root!r}")
    # A rank >= size is refused by the runtime when the op runs, against the
    # cluster of that moment (it can change between tracing and running).
    return rank


def _check_mean(op: str, dtype: tf.DType) -> None:
    # The kernel divides the sum by the cluster size read at run time.
    if op == "mean" and not dtype.is_floating:
        raise ValueError(f"op='mean' needs a floating-point tensor, got {dtype.name}; use 'sum'")


def _topology_attr(topology: str | None) -> str:
    # '' asks the kernel for the runtime's current topology at every run.
    return "" if topology is None or topology == "" else topology_name(topology)


def all_reduce(x: tf.Tensor, op: str = "sum", name: str | None = None, topology: str | None = None) -> tf.Tensor:
    """Element-wise ``op`` ("sum", "min", "max", "prod", "mean") of ``x`` over all workers.

    ``topology``: None (or "") uses the runtime's current topology, read at
    every run, so :func:`kungfu_tf.ops.set_topology` applies to it; one of
    STAR, RING, BINARY_TREE, BINARY_TREE_STAR, CLIQUE, AUTO (any case) pins
    this collective to that topology. Every worker must pass the same
    topology for the same ``name``. An unknown name raises ValueError.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf import ops
        >>> ops.all_reduce(tf.constant([1.0, 2.0]), topology="RING").numpy()  # one worker
        array([1., 2.], dtype=float32)
    """
    _admitted()
    _check_op(op)
    attr = _topology_attr(topology)
    x = tf.convert_to_tensor(x)
    _check_mean(op, x.dtype)
    return library().kungfu_all_reduce(x, message_key("all_reduce", name), op=op, topology=attr)


def group_all_reduce(
    xs: Sequence[tf.Tensor], op: str = "sum", name: str | None = None, topology: str | None = None
) -> list[tf.Tensor]:
    """All-reduces several tensors with one collective per dtype over one fused buffer.

    ``topology`` as in :func:`all_reduce` (applies to every fused collective).

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf import ops
        >>> a, b = ops.group_all_reduce([tf.ones([2]), tf.zeros([3], tf.int32)], topology="STAR")
        >>> a.numpy(), b.numpy()  # one worker
        (array([1., 1.], dtype=float32), array([0, 0, 0], dtype=int32))
    """
    _admitted()
    _check_op(op)
    attr = _topology_attr(topology)
    xs = [tf.convert_to_tensor(x) for x in xs]
    if not xs:
        return []
    by_dtype: dict[tf.DType, list[int]] = {}
    for i, x in enumerate(xs):
        by_dtype.setdefault(x.dtype, []).append(i)
    out: list[tf.Tensor | None] = [None] * len(xs)
    for dtype, idx in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
        group_name = None if name is None else (name if len(by_dtype) == 1 else f"{name}/{dtype.name}")
        _check_mean(op, dtype)
        key = message_key("group_all_reduce", group_name)
        reduced = library().kungfu_group_all_reduce([xs[i] for i in idx], key, op=op, topology=attr)
        for i, r in zip(idx, reduced):
            out[i] = r
    return out


def broadcast(x: tf.Tensor, root: int = 0, name: str | None = None) -> tf.Tensor:
    """Every worker receives worker ``root``'s ``x``.

    ``root`` is a rank: an int (or numpy integer, or a constant integer scalar
    tensor). ``1.9``, ``True`` or a tensor computed at run time raise
    TypeError, ``-1`` ValueError; a rank >= the cluster size fails with
    InvalidArgumentError when the op runs.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf import ops
        >>> ops.broadcast(tf.constant([1, 2]), root=0).numpy()  # one worker
        array([1, 2], dtype=int32)
    """
    _admitted()
    rank = _root_rank(root, "broadcast")
    x = tf.convert_to_tensor(x)
    return library().kungfu_broadcast(x, message_key("broadcast", name), root=rank)


def reduce(x: tf.Tensor, root: int = 0, op: str = "sum", name: str | None = None) -> tf.Tensor:
    """Element-wise ``op`` ("sum", "min", "max", "prod", "mean") of ``x`` over all workers, to ``root`` only.

    On worker ``root`` the result is the reduction ("mean" divides the sum by
    the cluster size at run time). On every other worker the result is its own
    ``x``, unchanged: the reduction is not sent back (that would be
    :func:`all_reduce`), so each non-root worker sends about the size of ``x``
    and receives nothing. ``root`` is checked as in :func:`broadcast`.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf import ops
        >>> ops.reduce(tf.constant([1, 2]), root=0, op="max").numpy()  # one worker
        array([1, 2], dtype=int32)
    """
    _admitted()
    _check_op(op)
    rank = _root_rank(root, "reduce")
    x = tf.convert_to_tensor(x)
    _check_mean(op, x.dtype)
    return library().kungfu_reduce(x, message_key("reduce", name), op=op, root=rank)


def all_gather(x: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """Stacks every worker's ``x`` (same shape everywhere) along a new leading axis of size np."""
    _admitted()
    x = tf.convert_to_tensor(x)
    return library().kungfu_all_gather(x, message_key("all_gather", name))


def keep_alive(tensors: Sequence[tf.Tensor | tf.Operation | None]) -> tf.Operation | None:
    """A stateful op that makes every tensor (and op) in ``tensors`` run, even if nothing reads it.

    Tensors become data inputs of the op, so Grappler cannot drop the
    collectives that produce them (see the module docstring); operations and
    resource handles become control inputs; ``None`` is skipped. In
    ``tf.function`` the op runs by itself (it is stateful); in a v1 graph, run
    it or make the train op depend on it. Eagerly everything already ran and
    None is returned.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf import ops
        >>> @tf.function
        ... def step(x):
        ...     mine = ops.reduce(x, root=0, name="doc_keep_alive")  # unused on non-roots
        ...     ops.keep_alive([mine])
        ...     return x
        >>> step(tf.ones([2])).numpy()
        array([1., 1.], dtype=float32)
    """
    if tf.executing_eagerly():
        return None
    data, control = [], []
    for t in tensors:
        if t is None:
            continue
        if isinstance(t, tf.Tensor) and t.dtype not in (tf.resource, tf.variant):
            data.append(t)
        else:
            control.append(t)
    with tf.control_dependencies(control):
        return library().kungfu_keep_alive(data)


def barrier(name: str | None = None) -> tf.Operation | None:
    """Waits until every worker has reached this barrier."""
    _admitted()
    return library().kungfu_barrier(message_key("barrier", name))


def consensus(x: tf.Tensor, name: str | None = None) -> tf.Tensor:
    """True on every worker iff all workers passed identical ``x`` (shape, dtype and bytes)."""
    _admitted()
    x = tf.convert_to_tensor(x)
    return library().kungfu_consensus(x, message_key("consensus", name))
