"""A strategy as a fixed-length feature vector: the cost model's components plus raw features (AutoDist Eq. 3).

AutoDist's ranker reads ``z_predefined ⊕ z_raw``: the simulator's components
and raw attributes of the variables and the strategy (shape, sparsity, dtype,
synchronizer, destination, merge group, compressor). Its RNN reads one
variable at a time; a small tabular model needs one vector per strategy, so
the per-variable attributes are summarised by what they do to traffic:
which share of the bytes each synchronizer carries, how evenly owners and
groups share them, how many messages and shards there are, which topologies
carry the all-reduced bytes.

Column 0 is always the cost model's predicted step time, so a ranker without
enough trials falls back to it (:class:`~kungfu_tf.strategy.auto.ranker.Ranker`).

Example:
    >>> from kungfu_tf.strategy.auto.cost_model import CostModel
    >>> from kungfu_tf.strategy.auto.features import FEATURE_NAMES, strategy_features
    >>> from kungfu_tf.strategy.auto.link_rates import LinkRates
    >>> from kungfu_tf.strategy.builders import build
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> vs, cluster = [VariableInfo("w", (100, 10))], ClusterSpec(2)
    >>> s = build("PS", vs, cluster)
    >>> cost = CostModel().predict(s, vs, cluster, LinkRates.uniform(2, 1e9, 1e-4))
    >>> x = strategy_features(s, vs, cluster, cost)
    >>> len(x) == len(FEATURE_NAMES), float(x[FEATURE_NAMES.index("ps_dense_share")])
    (True, 1.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.cost_model import COMPONENTS, CostBreakdown, CostModel
from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.resolved_node import ResolvedNode
from kungfu_tf.strategy.validation import effective_nodes
from kungfu_tf.strategy.variable_info import VariableInfo

_TOPOLOGIES = ("AUTO", "STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")

FEATURE_NAMES: tuple[str, ...] = (
    "predicted_step_time",
    *COMPONENTS,
    "ar_dense_share",
    "ar_sparse_share",
    "ps_dense_share",
    "ps_sparse_share",
    "compressed_share",
    "log_tensors",
    "log_messages",
    "ar_groups",
    "largest_group_share",
    "partitioned_share",
    "mean_shards",
    "owner_imbalance",
    "busiest_owner_share",
    "owners_used_share",
    *(f"topology_{t.lower()}_share" for t in _TOPOLOGIES),
)


def _sparse_rows(node: ResolvedNode) -> bool:
    v = node.variable
    return v is not None and v.sparse and (node.axis is None or node.axis == 0)


def strategy_features(
    strategy: strategy_pb2.Strategy,
    variables: Sequence[VariableInfo],
    cluster: ClusterSpec,
    cost: CostBreakdown,
) -> np.ndarray:
    """The feature vector (float64, :data:`FEATURE_NAMES` order) of ``strategy``, with its ``cost`` breakdown.

    Shares are fractions of the model's bytes (or of the all-reduced or PS
    bytes), so models of any size give numbers of the same scale.
    """
    nodes = effective_nodes(strategy, variables, cluster.replicas)
    total = float(sum(v.nbytes for v in variables)) or 1.0
    sizes = [float(n.nbytes or 0) for n in nodes]

    def share(pick: Sequence[bool]) -> float:
        return sum(s for s, p in zip(sizes, pick, strict=True) if p) / total

    ar = [n.kind == "all_reduce" for n in nodes]
    rows = [_sparse_rows(n) for n in nodes]
    ar_bytes: dict[int, float] = {}
    topology_bytes = dict.fromkeys(_TOPOLOGIES, 0.0)
    owner_bytes = [0.0] * cluster.replicas
    for n, size in zip(nodes, sizes, strict=True):
        if n.kind == "all_reduce" and not _sparse_rows(n):
            assert n.group is not None
            ar_bytes[n.group] = ar_bytes.get(n.group, 0.0) + size
            topology_bytes[n.topology] = topology_bytes.get(n.topology, 0.0) + size
        elif n.kind == "ps" and n.owner is not None:
            owner_bytes[n.owner] += size
    ar_total = sum(ar_bytes.values()) or 1.0
    ps_total = sum(owner_bytes) or 1.0
    mean_owner = sum(owner_bytes) / cluster.replicas
    partitioned = {n.var_name for n in nodes if n.is_shard}
    values = [
        cost.total,
        *cost.components,
        share([a and not r for a, r in zip(ar, rows, strict=True)]),
        share([a and r for a, r in zip(ar, rows, strict=True)]),
        share([not a and not r for a, r in zip(ar, rows, strict=True)]),
        share([not a and r for a, r in zip(ar, rows, strict=True)]),
        share([bool(n.wire_dtype) for n in nodes]),
        math.log1p(len(nodes)),
        math.log1p(cost.messages),
        float(len(ar_bytes)),
        max(ar_bytes.values(), default=0.0) / ar_total,
        sum(v.nbytes for v in variables if v.name in partitioned) / total,
        len(nodes) / len(variables),
        max(owner_bytes) / mean_owner if mean_owner > 0 else 0.0,
        max(owner_bytes) / ps_total if sum(owner_bytes) > 0 else 0.0,
        sum(1 for b in owner_bytes if b > 0) / cluster.replicas,
        *(topology_bytes[t] / ar_total if ar_bytes else 0.0 for t in _TOPOLOGIES),
    ]
    return np.array(values, dtype=np.float64)


def feature_matrix(
    strategies: Sequence[strategy_pb2.Strategy],
    variables: Sequence[VariableInfo],
    cluster: ClusterSpec,
    rates: LinkRates,
    cost_model: CostModel | None = None,
    compute_time: float = 0.0,
) -> tuple[np.ndarray, list[CostBreakdown]]:
    """[len(strategies), len(FEATURE_NAMES)] features and each strategy's cost breakdown.

    Example:
        >>> from kungfu_tf.strategy.auto.sampler import sample_strategies
        >>> vs, cluster = [VariableInfo("w", (100, 10))], ClusterSpec(2)
        >>> x, costs = feature_matrix(sample_strategies(vs, cluster, 3, 0), vs, cluster, LinkRates.uniform(2, 1e9, 1e-4))
        >>> x.shape, len(costs)
        ((3, 27), 3)
    """
    model = cost_model or CostModel()
    costs = [model.predict(s, variables, cluster, rates, compute_time) for s in strategies]
    rows = [strategy_features(s, variables, cluster, c) for s, c in zip(strategies, costs, strict=True)]
    return (np.stack(rows) if rows else np.zeros((0, len(FEATURE_NAMES)))), costs
