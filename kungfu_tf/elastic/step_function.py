"""``kungfu_tf.elastic.function``: a ``tf.function`` that is traced again after a strategy was re-built.

A strategy's parameter-server owners, shards and slot placement are the shape
of the traced step, and a membership change re-builds them for the new
cluster (kungfu_tf/optimizers/strategy_resize.py). A plain ``tf.function``
keeps its first trace, which then refuses to run with a precise error
(kungfu_tf/strategy/plan_generation.py). This decorator keeps one
``tf.function`` per plan generation: the first call after a change traces the
step again (once per change; its cost is in docs/guide/strategies.md), every
other call runs the current trace.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.elastic import function
    >>> v = tf.Variable(1.0)
    >>> @function
    ... def step(x):
    ...     return v.assign_add(x)
    >>> float(step(tf.constant(2.0))), step.traces
    (3.0, 1)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from kungfu_tf.strategy import plan_generation, step_driver


class RetracingFunction:
    """``fn`` as a ``tf.function`` (with ``tf_function_options``), traced again when the strategy was re-built.

    ``traces`` counts the ``tf.function`` objects made (1 until the first
    change). Decorate plain functions (not methods).

    Example:
        >>> f = RetracingFunction(lambda x: x * 2, {"reduce_retracing": True})
        >>> int(f(tf.constant(3))), f.traces
        (6, 1)
    """

    def __init__(self, fn: Callable[..., Any], tf_function_options: dict[str, Any]) -> None:
        if not callable(fn):
            raise TypeError(f"kungfu_tf.elastic.function decorates a Python function, got {type(fn).__name__}")
        if isinstance(fn, (RetracingFunction, tf.types.experimental.PolymorphicFunction)):
            raise TypeError(
                "kungfu_tf.elastic.function decorates the Python function itself, not a tf.function or an "
                "elastic.function (it makes the tf.function, once per strategy change)"
            )
        tf.function(fn, **tf_function_options)  # unknown options raise here, where the step is defined
        self.python_function = fn
        self._options = dict(tf_function_options)
        self._traced: Any = None
        self._generation = -1
        self.traces = 0
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A strategy search (builders.Auto) may switch strategy before the call
        # or run it again after a failed trial: the trace is chosen inside.
        return step_driver.run_step(lambda: self._call_current(*args, **kwargs))

    def _call_current(self, *args: Any, **kwargs: Any) -> Any:
        generation = plan_generation.current()
        if self._traced is None or generation != self._generation:
            self._traced = tf.function(self.python_function, **self._options)
            self._generation = generation
            self.traces += 1
        return self._traced(*args, **kwargs)


def function(fn: Callable[..., Any] | None = None, **tf_function_options: Any) -> Any:
    """Like ``tf.function`` (same options), but traced again after each membership change re-built a strategy.

    Use it for the training step of an elastic job whose optimizer has a
    ``strategy`` (``SynchronousSGDOptimizer(opt, strategy=...)``); without a
    change it is one ``tf.function``.

    Example:
        >>> @function(reduce_retracing=True)
        ... def double(x):
        ...     return x * 2
        >>> int(double(tf.constant(4)))
        8
    """
    if fn is None:
        return lambda f: RetracingFunction(f, tf_function_options)
    return RetracingFunction(fn, tf_function_options)
