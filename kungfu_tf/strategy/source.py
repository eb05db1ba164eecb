"""Where a strategy comes from: a proto, a builder, a file or a builder's name.

``SynchronousSGDOptimizer(opt, strategy=...)`` accepts any of these; the
strategy itself is only made when the optimizer sees the model's variables.

Example:
    >>> from kungfu_tf.strategy.source import resolve_strategy
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> s = resolve_strategy("PSLoadBalancing", [VariableInfo("w", (2,))], ClusterSpec(2))
    >>> s.id, s.node_config[0].ps.owner
    ('PSLoadBalancing', 0)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.builder import Auto, is_auto
from kungfu_tf.strategy.builders import BUILDERS
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import load
from kungfu_tf.strategy.variable_info import VariableInfo

StrategySource = strategy_pb2.Strategy | StrategyBuilder | str | os.PathLike


def check_source(source: object) -> None:
    """``TypeError``/``StrategyError`` now for a source that can never work (before training starts).

    Example:
        >>> check_source(42)
        Traceback (most recent call last):
        ...
        TypeError: strategy must be a Strategy proto, a StrategyBuilder, a file path or a builder name; got int
    """
    if isinstance(source, (strategy_pb2.Strategy, StrategyBuilder)):
        return
    if isinstance(source, (str, os.PathLike)):
        if isinstance(source, str) and (source in BUILDERS or is_auto(source)):
            return
        if not Path(source).is_file():
            raise StrategyError(
                f"strategy {str(source)!r} is neither a file nor a builder name (builders: {', '.join(BUILDERS)}, Auto)"
            )
        return
    raise TypeError(
        "strategy must be a Strategy proto, a StrategyBuilder, a file path or a builder name; "
        f"got {type(source).__name__}"
    )


def resolve_strategy(
    source: StrategySource, variables: Sequence[VariableInfo], cluster: ClusterSpec
) -> strategy_pb2.Strategy:
    """The strategy ``source`` stands for, for these variables on this cluster.

    A builder name (e.g. ``"Parallax"``) runs that builder with default
    settings (``"Auto"``: the search's starting strategy, see
    kungfu_tf/strategy/auto/builder.py); any other string or path is loaded
    as a strategy file.
    """
    check_source(source)
    if isinstance(source, strategy_pb2.Strategy):
        return source
    if isinstance(source, StrategyBuilder):
        return source.build(variables, cluster)
    if isinstance(source, str) and source in BUILDERS:
        return BUILDERS[source]().build(variables, cluster)
    if isinstance(source, str) and is_auto(source):
        return Auto().build(variables, cluster)
    return load(source)

