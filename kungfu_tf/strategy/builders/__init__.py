"""Strategy builders: strategies made from a model's variables and the cluster.

Example:
    >>> from kungfu_tf.strategy.builders import build
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> s = build("PSLoadBalancing", [VariableInfo("w", (4,))], ClusterSpec(2))
    >>> s.node_config[0].ps.owner
    0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.builders.all_reduce import AllReduce, PartitionedAR
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.builders.parallax import Parallax
from kungfu_tf.strategy.builders.parameter_server import (
    PS,
    PartitionedPS,
    PSLoadBalancing,
    UnevenPartitionedPS,
)
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.variable_info import VariableInfo

BUILDERS: dict[str, type[StrategyBuilder]] = {
    cls.name: cls
    for cls in (AllReduce, PS, PSLoadBalancing, PartitionedPS, UnevenPartitionedPS, PartitionedAR, Parallax)
}


if TYPE_CHECKING:
    from kungfu_tf.strategy.auto.builder import Auto


def __getattr__(name: str) -> Any:
    # builders.Auto lives with the search it runs (kungfu_tf/strategy/auto/builder.py), which
    # builds on the builders here: imported when first asked for, so neither import waits on the other.
    if name == "Auto":
        from kungfu_tf.strategy.auto.builder import Auto

        return Auto
    raise AttributeError(f"module 'kungfu_tf.strategy.builders' has no attribute {name!r}")


def build(name: str, variables: Sequence[VariableInfo], cluster: ClusterSpec, **options: Any) -> strategy_pb2.Strategy:
    """The strategy builder ``name`` (constructed with ``options``) makes for ``variables`` on ``cluster``.

    Raises:
        ValueError: unknown builder name (the message lists the valid ones).
    """
    try:
        cls = BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown strategy builder {name!r}; choose one of: {', '.join(BUILDERS)}") from None
    return cls(**options).build(variables, cluster)


__all__ = [
    "BUILDERS",
    "PS",
    "AllReduce",
    "Auto",
    "PSLoadBalancing",
    "Parallax",
    "PartitionedAR",
    "PartitionedPS",
    "StrategyBuilder",
    "UnevenPartitionedPS",
    "build",
]
