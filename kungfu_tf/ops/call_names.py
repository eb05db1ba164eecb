"""Message-key prefixes for code that issues collectives more than once per graph: ``call_prefix``.

A message key may be used once per graph, but a graph may hold a call site
more than once (two optimizers, two apply calls in one ``tf.function``):
numbering the calls keeps the keys unique, and identical on every worker that
runs the same program. Shared by the optimizers and the strategy compiler.

Example:
    >>> from kungfu_tf.ops.call_names import call_prefix
    >>> call_prefix("sgd")  # eager: unchanged
    'sgd'
"""

from __future__ import annotations

import collections
import threading
import weakref

import tensorflow as tf

# Per graph: how many times each prefix has been used. A name may be used once
# per graph (it is a message key), but one graph may average gradients more
# than once (two optimizers, two apply calls in one tf.function); numbering the
# calls keeps the keys unique and identical on every worker that runs the same
# program.
_calls: weakref.WeakKeyDictionary[tf.Graph, collections.Counter[str]] = weakref.WeakKeyDictionary()
_calls_lock = threading.Lock()


def call_prefix(prefix: str) -> str:
    """``prefix`` for this call: unique within the current graph, stable across workers.

    In eager mode the prefix is returned unchanged: eager collectives complete
    before the next one is issued, so reusing a key is safe there (as it is
    when a ``tf.function`` runs its one graph step after step).

    Example:
        >>> call_prefix("sgd")  # eager
        'sgd'
    """
    if tf.executing_eagerly():
        return prefix
    graph = tf.compat.v1.get_default_graph()
    with _calls_lock:
        counter = _calls.setdefault(graph, collections.Counter())
        n = counter[prefix]
        counter[prefix] += 1
    return prefix if n == 0 else f"{prefix}/call{n}"
