"""Parallax: sparse variables on parameter servers, dense variables all-reduced.

Parallax (Kim et al., EuroSys 2019) observed that embedding gradients touch
few rows, which a PS moves cheaply, while dense gradients suit all-reduce.
Large sparse tables are partitioned and balanced like PartitionedPS.

Example:
    >>> from kungfu_tf.strategy.builders.parallax import Parallax
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> vs = [VariableInfo("emb", (10, 4), sparse=True), VariableInfo("w", (4, 2))]
    >>> [n.WhichOneof("synchronizer") for n in Parallax().build(vs, ClusterSpec(2)).node_config]
    ['ps', 'all_reduce']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.builders.all_reduce import AllReduce
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.builders.parameter_server import PartitionedPS
from kungfu_tf.strategy.builders.partition_choice import DEFAULT_MIN_PARTITION_BYTES
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.variable_info import VariableInfo


class Parallax(StrategyBuilder):
    """Sparse → partitioned, load-balanced PS; dense → all-reduce in merge groups.

    Example:
        >>> Parallax(chunk_size=64).name
        'Parallax'
    """

    name = "Parallax"

    def __init__(
        self,
        chunk_size: int = 128,
        topology: str = "",
        compressor: str = "",
        min_partition_bytes: int = DEFAULT_MIN_PARTITION_BYTES,
    ) -> None:
        self.dense = AllReduce(chunk_size, topology, compressor)
        self.sparse = PartitionedPS(min_partition_bytes)

    def config(self) -> dict[str, Any]:
        """The constructor's arguments (they live in the two builders it combines)."""
        return {
            "chunk_size": self.dense.chunk_size,
            "topology": self.dense.topology,
            "compressor": self.dense.compressor,
            "min_partition_bytes": self.sparse.min_partition_bytes,
        }

    def nodes(self, variables: Sequence[VariableInfo], cluster: ClusterSpec) -> list[strategy_pb2.Node]:
        dense = self.dense.nodes([v for v in variables if not v.sparse], cluster)
        sparse = self.sparse.nodes([v for v in variables if v.sparse], cluster)
        by_name = {n.var_name: n for n in dense + sparse}
        return [by_name[v.name] for v in variables]
