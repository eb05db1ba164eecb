"""A written strategy (a proto or a file) on a cluster that changed: its owners re-mapped to the new ranks.

Builders are re-run for the new cluster; a written strategy cannot be, but
the only part of it that names the cluster is its parameter-server owners
(ranks). An owner that is still in the job keeps its variables (it holds
their optimizer slots), whatever its new rank; the variables of an owner that
left go to ``old rank mod new size``. A strategy written for a fixed number
of replicas (``graph_config.replicas``) is refused: it said it fits only that.

Example:
    >>> from kungfu_tf.strategy import format as strategy_format
    >>> s = strategy_format.parse('node_config { var_name: "w" ps { owner: 2 } }')
    >>> remap_owners(s, ("a", "b", "c"), ("b", "c")).node_config[0].ps.owner   # "c" is rank 1 now
    1
"""

from __future__ import annotations

from collections.abc import Sequence

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.errors import StrategyError


def check_replicas(strategy: strategy_pb2.Strategy, new_size: int) -> None:
    """``StrategyError`` if ``strategy`` was written for a fixed number of replicas other than ``new_size``.

    Example:
        >>> from kungfu_tf.strategy import format as strategy_format
        >>> check_replicas(strategy_format.parse('graph_config { replicas: 2 }'), 2)   # fits: nothing raised
    """
    written = strategy.graph_config.replicas
    if written > 0 and written != new_size:
        raise StrategyError(
            f"strategy {strategy.id!r} was written for {written} replicas (graph_config.replicas) and the cluster "
            f"changed to {new_size} workers; set graph_config.replicas to 0 (any) to let kungfu_tf re-map "
            "its owners, or pass a builder (re-run at every change)"
        )


def remap_owners(
    strategy: strategy_pb2.Strategy, old_peers: Sequence[str], new_peers: Sequence[str]
) -> strategy_pb2.Strategy:
    """A copy of ``strategy`` whose owners are ranks of ``new_peers`` (see the module docstring).

    Raises:
        StrategyError: the strategy was written for ``graph_config.replicas``
            workers and the cluster now has another number.
    """
    check_replicas(strategy, len(new_peers))
    out = strategy_pb2.Strategy()
    out.CopyFrom(strategy)
    new_rank = {peer: r for r, peer in enumerate(new_peers)}

    def owner_of(old: int) -> int:
        if 0 <= old < len(old_peers) and old_peers[old] in new_rank:
            return new_rank[old_peers[old]]
        return old % len(new_peers)

    for node in out.node_config:
        for n in [node, *node.part_config]:
            if n.WhichOneof("synchronizer") == "ps":
                n.ps.owner = owner_of(n.ps.owner)
    return out
