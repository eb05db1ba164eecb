"""Which traced steps are current: a counter that goes up each time a strategy plan is re-built or switched.

A strategy is a function of (variables, cluster): after a membership change
every worker re-builds its plan, and the new plan's parameter-server owners,
shards and optimizer slots differ from the old one's. Those are the *shape*
of the traced step (which rank reduces to whom, which variables this rank's
optimizer updates), not values a stateful op could re-read, so a step traced
for the old plan cannot run the new one: it must be traced again.

Each graph a plan is traced into checks, before its first collective, that
the generation it was traced at is still the current one (a stateful read of
a variable, so a traced graph sees every change): a stale step stops with a
precise error instead of sending gradients to an owner that left.
``kungfu_tf.elastic.function`` re-traces a step once per generation.

Example:
    >>> from kungfu_tf.strategy import plan_generation
    >>> before = plan_generation.current()
    >>> plan_generation.advance() == before + 1
    True
"""

from __future__ import annotations

import threading

import tensorflow as tf

_lock = threading.Lock()
_generation = 0
_variable: tf.Variable | None = None


def current() -> int:
    """The current generation (0 until a plan is first re-built)."""
    return _generation


def advance() -> int:
    """Marks every step traced so far as stale (a plan was re-built); returns the new generation."""
    global _generation
    with _lock:
        _generation += 1
        if _variable is not None:
            with tf.init_scope():
                _variable.assign(_generation)
        return _generation


def _generation_variable() -> tf.Variable:
    global _variable
    with _lock:
        if _variable is None:
            with tf.init_scope():  # outside the graph being traced: one variable per process
                _variable = tf.Variable(_generation, dtype=tf.int64, trainable=False, name="kungfu_strategy_generation")
        return _variable


def check_current(what: str) -> tf.Operation:
    """An op that fails if the strategy was re-built since this graph was traced (``what`` names the plan)."""
    traced = current()
    return tf.debugging.assert_equal(
        _generation_variable().read_value(),
        tf.constant(traced, tf.int64),
        message=(
            f"strategy {what}: this step was traced for the strategy as it was before a membership change or a "
            f"strategy switch (plan generation {traced}); the strategy was re-built (its owners, shards and "
            "optimizer slots differ), so the step must be traced again: define it with "
            "kungfu_tf.elastic.function instead of tf.function (it re-traces once per change), or re-create "
            "your tf.function in a reset callback (ElasticState.register_reset_callbacks); in Keras fit, "
            "switch_strategy(..., model=model) or a PolicyCallback makes fit trace it again"
        ),
    )
