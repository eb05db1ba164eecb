"""AutoDist's guided strategy sampler: random strategies, steered by three constraints.

Sampling every field at random wastes the search on strategies no one would
try, so (papers/autodist-composable-sync.md §2.4, "Strategy sampler"):

1. **Partitioning by size**: a variable below ``min_partition_bytes`` is never
   cut (the per-message cost would dominate), one at or above
   ``always_partition_bytes`` is always cut, and those between are cut or not
   at random, into a random number of shards.
2. **Balanced PS placement**: the synchronizer (all-reduce or PS) is drawn
   per variable, then every PS tensor (whole variable or shard) is placed by
   the greedy balancer all PS builders use (largest first onto the least
   loaded rank, hosts spread), so owners carry similar bytes.
3. **Balanced merge groups**: the all-reduced tensors, in model order, are
   cut into a random number of contiguous groups of similar bytes (no group
   exceeds an even share by more than its largest tensor).

Each sample first draws a "style" (the share of variables on PS, dense and
sparse apart), so the candidates span all-reduce-only, PS-only and hybrids.
The hand builders' strategies come first (the search can then never end
worse than the best builder it measured), duplicates are dropped by their
canonical bytes, and everything is drawn from one seeded generator: every
worker that calls this with the same arguments gets the same list. Lossy
compression and staleness change what training computes, so (as AutoDist
does) they are left out unless ``SamplerOptions`` asks for them.

Example:
    >>> from kungfu_tf.strategy.auto.sampler import sample_strategies
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> vs = [VariableInfo("emb", (50000, 64), sparse=True), VariableInfo("w", (64, 10)), VariableInfo("b", (10,))]
    >>> cands = sample_strategies(vs, ClusterSpec(4), count=12, seed=1)
    >>> [s.id for s in cands[:3]], len(cands)
    (['AllReduce', 'PS', 'PSLoadBalancing'], 12)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.builders.base import all_reduce_node, partitioned_node, ps_node
from kungfu_tf.strategy.builders.load_balancing import LoadBalancer
from kungfu_tf.strategy.builders.partition_choice import (
    DEFAULT_MIN_PARTITION_BYTES,
    choose_partition,
)
from kungfu_tf.strategy.choices import (
    check_compressor,
    check_topology,
    compressor_parts,
)
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.partition_spec import PartitionSpec, part_name, shard_sizes
from kungfu_tf.strategy.validation import validate
from kungfu_tf.strategy.variable_info import VariableInfo, check_unique_names

# Variables this large are always cut: one message of this size is bound by a
# single flow and cannot spread over owners or pipeline with the others.
DEFAULT_ALWAYS_PARTITION_BYTES = 16 * 1024 * 1024
# The share of variables on PS in one sample's style: all-reduce only, PS only, and hybrids between.
_PS_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
# Builders that search themselves (and would call the sampler back) are not hand builders.
_SEARCHING_BUILDERS = frozenset({"Auto"})


@dataclass(frozen=True)
class SamplerOptions:
    """The sampler's knobs; the defaults follow AutoDist's synchronous search.

    Args:
        min_partition_bytes: never cut a variable smaller than this.
        always_partition_bytes: always cut a variable at least this large.
        max_shards: most shards of one variable (default: the number of replicas, at least 2).
        max_groups: most all-reduce merge groups of one strategy.
        topologies: all-reduce topologies a merge group may use ("" = AUTO).
        compressors: compressors an all-reduced tensor may use; "" only by
            default (lossy compression changes the training).
        include_builders: put the hand builders' strategies first.
        attempts_per_candidate: draws allowed per wanted candidate before
            the sampler stops short (a small model has few distinct strategies).

    Example:
        >>> SamplerOptions(min_partition_bytes=10, always_partition_bytes=5)
        Traceback (most recent call last):
        ...
        kungfu_tf.strategy.errors.StrategyError: sampler: always_partition_bytes (5) must be >= min_partition_bytes (10)
    """

    min_partition_bytes: int = DEFAULT_MIN_PARTITION_BYTES
    always_partition_bytes: int = DEFAULT_ALWAYS_PARTITION_BYTES
    max_shards: int | None = None
    max_groups: int = 8
    topologies: tuple[str, ...] = ("", "RING", "STAR", "BINARY_TREE_STAR")
    compressors: tuple[str, ...] = ("",)
    include_builders: bool = True
    attempts_per_candidate: int = 20

    def __post_init__(self) -> None:
        if self.min_partition_bytes < 0:
            raise StrategyError(f"sampler: min_partition_bytes must be >= 0, got {self.min_partition_bytes}")
        if self.always_partition_bytes < self.min_partition_bytes:
            raise StrategyError(
                f"sampler: always_partition_bytes ({self.always_partition_bytes}) must be >= min_partition_bytes"
                f" ({self.min_partition_bytes})"
            )
        if self.max_shards is not None and self.max_shards < 2:
            raise StrategyError(f"sampler: max_shards must be >= 2, got {self.max_shards}")
        if self.max_groups < 1:
            raise StrategyError(f"sampler: max_groups must be >= 1, got {self.max_groups}")
        if not self.topologies or not self.compressors:
            raise StrategyError("sampler: topologies and compressors each need at least one choice")
        for t in self.topologies:
            check_topology(t, "sampler: topologies")
        for c in self.compressors:
            check_compressor(c, "sampler: compressors")
        if self.attempts_per_candidate < 1:
            raise StrategyError(f"sampler: attempts_per_candidate must be >= 1, got {self.attempts_per_candidate}")

    def shard_limit(self, cluster: ClusterSpec) -> int:
        """The most shards a variable may be cut into on ``cluster``."""
        return self.max_shards if self.max_shards is not None else max(2, cluster.replicas)


@dataclass
class _Piece:
    """One synchronised tensor of a sample: a whole variable or one shard."""

    name: str
    nbytes: int
    floating: bool


def balanced_groups(loads: Sequence[float], groups: int) -> list[int]:
    """Group of each item: ``groups`` contiguous runs of similar total load (fewer if items are fewer).

    An item joins the run its midpoint falls in, so every run holds at most
    an even share plus one item; empty runs are dropped and the ids renumbered.

    Example:
        >>> balanced_groups([4, 1, 1, 1, 1], 2)
        [0, 1, 1, 1, 1]
        >>> balanced_groups([1, 1, 1, 1, 1, 1], 3)
        [0, 0, 1, 1, 2, 2]
    """
    if groups < 1:
        raise ValueError(f"groups must be >= 1, got {groups}")
    total = float(sum(loads))
    if total <= 0:
        raw = [i * groups // max(1, len(loads)) for i in range(len(loads))]
    else:
        share = total / groups
        raw, before = [], 0.0
        for load in loads:
            raw.append(min(groups - 1, int((before + load / 2) // share)))
            before += load
    renumber = {g: i for i, g in enumerate(sorted(set(raw)))}
    return [renumber[g] for g in raw]


def _is_floating(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "half"))


class _Sampler:
    def __init__(self, variables: Sequence[VariableInfo], cluster: ClusterSpec, options: SamplerOptions, seed: int):
        self.variables = list(variables)
        self.cluster = cluster
        self.options = options
        self.rng = np.random.default_rng(seed)

    def _partition(self, v: VariableInfo) -> PartitionSpec | None:
        o = self.options
        if v.nbytes < o.min_partition_bytes or not v.shape:
            return None
        if v.nbytes < o.always_partition_bytes and self.rng.random() < 0.5:
            return None
        shards = int(self.rng.integers(2, o.shard_limit(self.cluster) + 1))
        return choose_partition(v, shards, min_bytes=0)

    def sample(self, index: int) -> strategy_pb2.Strategy:
        o = self.options
        dense_ps = float(self.rng.choice(_PS_SHARES))
        sparse_ps = float(self.rng.choice(_PS_SHARES))
        plans: list[tuple[VariableInfo, PartitionSpec | None, str, list[_Piece]]] = []
        for v in self.variables:
            spec = self._partition(v)
            kind = "ps" if self.rng.random() < (sparse_ps if v.sparse else dense_ps) else "all_reduce"
            floating = _is_floating(v.dtype)
            if spec is None:
                pieces = [_Piece(v.name, v.nbytes, floating)]
            else:
                row_bytes = v.nbytes // v.shape[spec.axis]
                pieces = [
                    _Piece(part_name(v.name, i), rows * row_bytes, floating)
                    for i, rows in enumerate(shard_sizes(v.shape[spec.axis], spec.shards))
                ]
            plans.append((v, spec, kind, pieces))

        ps_pieces = {p.name: p.nbytes for _, _, kind, pieces in plans if kind == "ps" for p in pieces}
        owners = LoadBalancer(self.cluster).place(ps_pieces)

        ar_pieces = [p for _, _, kind, pieces in plans if kind == "all_reduce" for p in pieces]
        group_of: dict[str, int] = {}
        compressor_of: dict[str, str] = {}
        topology_of: list[str] = []
        if ar_pieces:
            wanted = int(self.rng.integers(1, min(len(ar_pieces), o.max_groups) + 1))
            ids = balanced_groups([p.nbytes for p in ar_pieces], wanted)
            topology_of = [str(self.rng.choice(o.topologies)) for _ in range(max(ids) + 1)]
            for p, g in zip(ar_pieces, ids, strict=True):
                group_of[p.name] = g
                compressor = str(self.rng.choice(o.compressors))
                compressor_of[p.name] = compressor if p.floating or not compressor_parts(compressor)[0] else ""

        def node_for(name: str, kind: str) -> strategy_pb2.Node:
            if kind == "ps":
                return ps_node(name, owners[name])
            g = group_of[name]
            return all_reduce_node(name, g, topology_of[g], compressor_of[name])

        strategy = strategy_pb2.Strategy(id=f"auto-{index}")
        strategy.graph_config.replicas = self.cluster.replicas
        for v, spec, kind, _ in plans:
            if spec is None:
                strategy.node_config.append(node_for(v.name, kind))
            else:
                strategy.node_config.append(partitioned_node(v, spec, partial(_shard_node, node_for, kind)))
        return strategy


def _shard_node(
    node_for: Callable[[str, str], strategy_pb2.Node], kind: str, name: str, _index: int
) -> strategy_pb2.Node:
    return node_for(name, kind)


def _without_id(strategy: strategy_pb2.Strategy) -> bytes:
    copy = strategy_pb2.Strategy()
    copy.CopyFrom(strategy)
    copy.id = ""
    return canonical_bytes(copy)


def builder_strategies(variables: Sequence[VariableInfo], cluster: ClusterSpec) -> list[strategy_pb2.Strategy]:
    """Every hand builder's strategy with its default options, in ``BUILDERS`` order (ids are the builder names).

    Example:
        >>> [s.id for s in builder_strategies([VariableInfo("w", (2,))], ClusterSpec(2))][:2]
        ['AllReduce', 'PS']
    """
    # Imported here: the Auto builder lives among the builders and uses this module.
    from kungfu_tf.strategy.builders import BUILDERS

    return [cls().build(variables, cluster) for name, cls in BUILDERS.items() if name not in _SEARCHING_BUILDERS]


def sample_strategies(
    variables: Sequence[VariableInfo],
    cluster: ClusterSpec,
    count: int,
    seed: int,
    options: SamplerOptions | None = None,
) -> list[strategy_pb2.Strategy]:
    """Up to ``count`` distinct candidate strategies: the hand builders' first, then guided samples.

    The same arguments give the same list (in the same order) on every
    worker. Sampled strategies are named ``auto-<i>`` (i counts the draws,
    so names stay stable when duplicates are dropped). Fewer than ``count``
    come back only when the model has fewer distinct strategies than asked
    for (the sampler gives up after ``attempts_per_candidate * count`` draws).

    Raises:
        StrategyError: ``count`` < 1, no variables, duplicate variable names.

    Example:
        >>> sample_strategies([VariableInfo("w", (2,))], ClusterSpec(2), count=0, seed=0)
        Traceback (most recent call last):
        ...
        kungfu_tf.strategy.errors.StrategyError: sampler: count must be >= 1 candidate, got 0
    """
    if count < 1:
        raise StrategyError(f"sampler: count must be >= 1 candidate, got {count}")
    if not variables:
        raise StrategyError("sampler: the model has no trainable variables; there is no strategy to search")
    try:
        check_unique_names(variables)
    except ValueError as e:
        raise StrategyError(f"sampler: {e}") from None
    options = options or SamplerOptions()
    seen: set[bytes] = set()
    out: list[strategy_pb2.Strategy] = []

    def keep(strategy: strategy_pb2.Strategy) -> None:
        key = _without_id(strategy)
        if key in seen or len(out) >= count:
            return
        validate(strategy, variables, cluster.replicas)
        seen.add(key)
        out.append(strategy)

    if options.include_builders:
        for strategy in builder_strategies(variables, cluster):
            keep(strategy)
    sampler = _Sampler(variables, cluster, options, seed)
    for index in range(options.attempts_per_candidate * count):
        if len(out) >= count:
            break
        keep(sampler.sample(index))
    return out
