"""What every builder shares: the interface, and the node constructors.

A builder turns (variables, cluster) into a ``Strategy`` proto. Builders only
decide; the synchronizer settings are written by the constructors here, so a
strategy from any builder has the same shape as a hand-written one.

Example:
    >>> from kungfu_tf.strategy.builders.base import ps_node
    >>> print(ps_node("w", owner=1), end="")
    var_name: "w"
    ps {
      owner: 1
      sync: true
    }
"""

from __future__ import annotations

import abc
import inspect
import json
from collections.abc import Callable, Sequence
from typing import Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.partition_spec import (
    PartitionSpec,
    format_partitioner,
    part_name,
)
from kungfu_tf.strategy.variable_info import VariableInfo, check_unique_names


def all_reduce_node(var_name: str, group: int = 0, topology: str = "", compressor: str = "") -> strategy_pb2.Node:
    """A node synchronised by all-reduce in merge group ``group``."""
    node = strategy_pb2.Node(var_name=var_name)
    node.all_reduce.group = group
    node.all_reduce.topology = topology
    node.all_reduce.compressor = compressor
    return node


def ps_node(var_name: str, owner: int, sync: bool = True, staleness: int = 0) -> strategy_pb2.Node:
    """A node owned by rank ``owner`` (parameter-server synchronisation)."""
    node = strategy_pb2.Node(var_name=var_name)
    node.ps.owner = owner
    node.ps.sync = sync
    node.ps.staleness = staleness
    return node


def partitioned_node(
    variable: VariableInfo, spec: PartitionSpec, shard_node: Callable[[str, int], strategy_pb2.Node]
) -> strategy_pb2.Node:
    """A node cut by ``spec``; ``shard_node(part_name, i)`` makes the node of shard ``i``."""
    node = strategy_pb2.Node(
        var_name=variable.name, partitioner=format_partitioner(len(variable.shape), spec.axis, spec.shards)
    )
    for i in range(spec.shards):
        node.part_config.append(shard_node(part_name(variable.name, i), i))
    return node


class StrategyBuilder(abc.ABC):
    """Builds a strategy for a model's variables on a cluster.

    Subclasses implement :meth:`nodes`; :meth:`build` adds the id and the
    graph config and checks that variable names are unique.

    Example:
        >>> class Everything0(StrategyBuilder):
        ...     name = "everything-on-0"
        ...     def nodes(self, variables, cluster):
        ...         return [ps_node(v.name, 0) for v in variables]
        >>> s = Everything0().build([VariableInfo("w", (2,))], ClusterSpec(2))
        >>> s.id, s.graph_config.replicas, s.node_config[0].ps.owner
        ('everything-on-0', 2, 0)
        >>> Everything0().config()
        {}
    """

    name: str = ""

    @abc.abstractmethod
    def nodes(self, variables: Sequence[VariableInfo], cluster: ClusterSpec) -> list[strategy_pb2.Node]:
        """One node per variable, in the variables' order."""

    def build(self, variables: Sequence[VariableInfo], cluster: ClusterSpec) -> strategy_pb2.Strategy:
        """The strategy for ``variables`` on ``cluster``."""
        check_unique_names(variables)
        strategy = strategy_pb2.Strategy(id=self.name)
        strategy.graph_config.replicas = cluster.replicas
        strategy.node_config.extend(self.nodes(variables, cluster))
        return strategy

    def config(self) -> dict[str, Any]:
        """The constructor's arguments that make this builder again, JSON-able (a joiner re-makes it from them).

        By default each parameter of ``__init__`` is read from the attribute
        of the same name; a builder that keeps its settings otherwise
        overrides this (as ``Parallax`` does).

        Raises:
            StrategyError: a parameter has no attribute of its name, or a
                value JSON cannot carry: the message names both.
        """
        options: dict[str, Any] = {}
        for name, param in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            if not hasattr(self, name):
                raise StrategyError(
                    f"{type(self).__qualname__}.config(): __init__ takes {name!r} but the builder has no attribute "
                    "of that name; override config() to return the arguments that make this builder again"
                )
            options[name] = getattr(self, name)
        try:
            json.dumps(options)
        except (TypeError, ValueError) as e:
            raise StrategyError(f"{type(self).__qualname__}.config(): {options!r} is not JSON-able ({e})") from None
        return options
