"""The one exception every strategy problem raises.

Example:
    >>> from kungfu_tf.strategy.errors import StrategyError
    >>> issubclass(StrategyError, ValueError)
    True
"""

from __future__ import annotations


class StrategyError(ValueError):
    """A strategy that cannot be used: malformed, inconsistent with the model or the cluster.

    The message names the file (if any), the variable and the offending field.

    Example:
        >>> raise StrategyError("node 'dense/kernel': ps.owner 5 is out of range for 4 replicas")
        Traceback (most recent call last):
        ...
        kungfu_tf.strategy.errors.StrategyError: node 'dense/kernel': ps.owner 5 is out of range for 4 replicas
    """

    # Raised while a tf.function traces the user's step, it passes through AutoGraph, which re-raises
    # as the same type only a type whose __init__ is Exception's (else as a StagingError, and
    # `except StrategyError` would miss it); ValueError's __init__ takes the same arguments.
    __init__ = Exception.__init__
