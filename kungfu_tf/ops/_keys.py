"""Message keys: how the same collective is recognised on every worker.

Workers never negotiate which collective runs next; a message carries a key
and each worker matches keys (KungFu's named collective messages). The key
must therefore be computed identically on every worker:

* ``name=`` given: the key is that name, verbatim. Within one graph a name may
  be used once (two collectives with one key in the same step would mix).
* graphs and ``tf.function`` without ``name=``: the name of the graph plus a
  unique per-graph name in creation order, so the same program traced on every
  worker yields the same keys.
* eager code without ``name=``: the n-th unnamed call of a kind on one worker
  matches the n-th such call on every other worker.

A name is at most :data:`MAX_NAME_BYTES` bytes (UTF-8) and contains neither
``'\\x00'`` nor ``'\\x01'`` (the runtime's separator of internal sub-keys);
the kernels check the same rules for keys that do not come through here.
"""

from __future__ import annotations

import collections
import re
import threading
import weakref

import tensorflow as tf

from kungfu_tf._native import library

_eager_counts: collections.Counter[str] = collections.Counter()
_eager_lock = threading.Lock()
_explicit_names: weakref.WeakKeyDictionary[tf.Graph, set[str]] = weakref.WeakKeyDictionary()


def _graph_prefix(graph: tf.Graph) -> str:
    # FuncGraph names are the Python function's name ("train_step"); branch and
    # loop bodies carry uid suffixes that may differ across workers, so drop them.
    name = getattr(graph, "name", None) or "graph"
    return re.sub(r"_\d+$", "", name)


# Mirrors kMaxUserKeyBytes in ops/kernels/runtime_access.h: the runtime adds
# suffixes to a key and a frame carries at most 4096 bytes of it.
MAX_NAME_BYTES = 1024
_RESERVED = {"\x00": "'\\x00'", "\x01": "'\\x01' (reserved for internal sub-keys)"}


def check_name(name: object, what: str = "name") -> str:
    """``name`` if it can be a message key or p2p name, else ValueError naming ``what``.

    Example:
        >>> check_name("grads/dense")
        'grads/dense'
        >>> check_name("a\\x01b")
        Traceback (most recent call last):
        ...
        ValueError: name 'a\\x01b' contains '\\x01' (reserved for internal sub-keys) at offset 1
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{what} {name[:64]!r}... is {size} bytes in UTF-8; names may be at most {MAX_NAME_BYTES} bytes")
    for char, label in _RESERVED.items():
        at = name.find(char)
        if at >= 0:
            raise ValueError(f"{what} {name!r} contains {label} at offset {at}")
    return name


def message_key(kind: str, name: str | None) -> tf.Tensor:
    """A scalar string tensor holding the key for one collective of ``kind``."""
    if name is not None:
        check_name(name)
    if tf.executing_eagerly():
        if name is None:
            with _eager_lock:
                n = _eager_counts[kind]
                _eager_counts[kind] += 1
            name = f"eager/{kind}/{n}"
        return tf.constant(name)
    graph = tf.compat.v1.get_default_graph()
    if name is None:
        key = f"{_graph_prefix(graph)}/{graph.unique_name('kungfu_' + kind)}"
    else:
        used = _explicit_names.setdefault(graph, set())
        if name in used:
            raise ValueError(
                f"a kungfu collective named {name!r} already exists in this graph; "
                "names are message keys and must be unique per graph"
            )
        used.add(name)
        key = name
    # A stateful op produces the key so Grappler never folds or merges the
    # collective that consumes it (see ops/kernels/collective_kernels.cc).
    return library().kungfu_collective_key(key_name=key)
