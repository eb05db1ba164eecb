"""The collective engine's graphs, as the cost model needs them: which directed links a message loads.

Mirrors ops/runtime/topology.cc and plan.cc: a topology is a list of graph
pairs (a reduce graph, edges child -> parent, and a broadcast graph, edges
parent -> child); an all-reduce cuts its buffer into one equal piece per pair
and every edge of a pair carries that pair's piece. Rooted operations
(``reduce``/``broadcast`` to or from one rank, and each rank's part of an
``all_gather``) use one pair rooted at that rank (``rooted_pair`` in the
runtime: RING becomes a chain, CLIQUE a star). ``depth`` is the longest path
to or from the root: the number of messages that follow one another.

Example:
    >>> from kungfu_tf.strategy.auto.link_graphs import all_reduce_pairs, rooted_pair
    >>> [p.reduce_parent for p in all_reduce_pairs("STAR", (0, 0, 0))]
    [(-1, 0, 0)]
    >>> chain = rooted_pair("RING", (0, 0, 0), root=1)
    >>> chain.reduce_parent, chain.broadcast_parent, chain.depth
    ((1, -1, 0), (2, -1, 1), 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# The topologies AUTO chooses among (ops/runtime/auto_topology.cc: auto_candidates).
AUTO_CANDIDATES_ONE_HOST = ("STAR", "RING", "BINARY_TREE", "CLIQUE")
AUTO_CANDIDATES_HOSTS = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")


def auto_candidates(hosts: Sequence[int]) -> tuple[str, ...]:
    """The topologies the runtime's AUTO measures on a cluster with these hosts.

    Example:
        >>> auto_candidates((0, 1))
        ('STAR', 'RING', 'BINARY_TREE', 'BINARY_TREE_STAR', 'CLIQUE')
    """
    return AUTO_CANDIDATES_HOSTS if len(set(hosts)) > 1 else AUTO_CANDIDATES_ONE_HOST


def _depth(parent: Sequence[int]) -> int:
    longest = 0
    for start in range(len(parent)):
        hops, node = 0, start
        while parent[node] >= 0:
            node = parent[node]
            hops += 1
        longest = max(longest, hops)
    return longest


@dataclass(frozen=True)
class GraphPair:
    """One reduce tree and one broadcast tree over the ranks, both rooted at ``root``.

    ``reduce_parent[i]`` is where rank i sends its partial sum (-1: the root);
    ``broadcast_parent[i]`` is where rank i receives the result from.

    Example:
        >>> p = GraphPair(0, (-1, 0), (-1, 0))
        >>> p.reduce_edges(), p.broadcast_edges(), p.depth
        ([(1, 0)], [(0, 1)], 1)
    """

    root: int
    reduce_parent: tuple[int, ...]
    broadcast_parent: tuple[int, ...]

    def reduce_edges(self) -> list[tuple[int, int]]:
        """Directed (sender, receiver) links of the reduce phase."""
        return [(i, p) for i, p in enumerate(self.reduce_parent) if p >= 0]

    def broadcast_edges(self) -> list[tuple[int, int]]:
        """Directed (sender, receiver) links of the broadcast phase."""
        return [(p, i) for i, p in enumerate(self.broadcast_parent) if p >= 0]

    @property
    def depth(self) -> int:
        """Messages in sequence from the farthest rank to the root (the broadcast's is the same or less)."""
        return max(_depth(self.reduce_parent), _depth(self.broadcast_parent))


def _tree(parent: list[int], root: int) -> GraphPair:
    return GraphPair(root, tuple(parent), tuple(parent))


def star(n: int, root: int) -> GraphPair:
    """Every rank to ``root`` and back."""
    return _tree([-1 if i == root else root for i in range(n)], root)


def chain(n: int, root: int) -> GraphPair:
    """Reduce root+1 -> root+2 -> ... -> root; broadcast root -> root+1 -> ... -> root-1."""
    reduce_parent = [-1] * n
    broadcast_parent = [-1] * n
    for k in range(1, n):
        reduce_parent[(root + k) % n] = (root + k + 1) % n
    for k in range(n - 1):
        broadcast_parent[(root + k + 1) % n] = (root + k) % n
    return GraphPair(root, tuple(reduce_parent), tuple(broadcast_parent))


def _binary_tree_over(members: Sequence[int], parent: list[int]) -> None:
    for i in range(1, len(members)):
        parent[members[i]] = members[(i - 1) // 2]


def binary_tree(n: int, root: int) -> GraphPair:
    """A binary heap over the ranks rotated to start at ``root``."""
    parent = [-1] * n
    _binary_tree_over([(root + i) % n for i in range(n)], parent)
    return _tree(parent, root)


def binary_tree_star(hosts: Sequence[int], root: int) -> GraphPair:
    """A star inside each host to its first rank (``root`` leads its host), a binary tree over those."""
    groups: dict[int, list[int]] = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    ordered = sorted(groups.values(), key=lambda ranks: root not in ranks)  # stable: root's host first
    parent = [-1] * len(hosts)
    masters = []
    for ranks in ordered:
        if root in ranks:
            ranks = [root] + [r for r in ranks if r != root]
        masters.append(ranks[0])
        for r in ranks[1:]:
            parent[r] = ranks[0]
    _binary_tree_over(masters, parent)
    return _tree(parent, root)


def all_reduce_pairs(topology: str, hosts: Sequence[int]) -> list[GraphPair]:
    """The graph pairs an all-reduce on ``topology`` (not AUTO) cuts its buffer over.

    Example:
        >>> len(all_reduce_pairs("RING", (0, 0, 0, 0))), len(all_reduce_pairs("BINARY_TREE", (0, 0, 0, 0)))
        (4, 1)
    """
    n = len(hosts)
    if topology == "STAR":
        return [star(n, 0)]
    if topology == "BINARY_TREE":
        return [binary_tree(n, 0)]
    if topology == "BINARY_TREE_STAR":
        return [binary_tree_star(hosts, 0)]
    if topology == "RING":
        return [chain(n, r) for r in range(n)]
    if topology == "CLIQUE":
        return [star(n, r) for r in range(n)]
    raise ValueError(f"no graphs for topology {topology!r} (AUTO is chosen per message)")


def rooted_pair(topology: str, hosts: Sequence[int], root: int) -> GraphPair:
    """The pair a rooted operation (reduce, broadcast, all_gather part) uses on ``topology``."""
    n = len(hosts)
    if topology == "RING":
        return chain(n, root)
    if topology == "BINARY_TREE":
        return binary_tree(n, root)
    if topology == "BINARY_TREE_STAR":
        return binary_tree_star(hosts, root)
    return star(n, root)


@dataclass(frozen=True)
class LinkUse:
    """Bytes a message puts on every directed link, and the messages in sequence it needs.

    ``loads[i, j]``: bytes rank i sends to rank j; ``hops``: the longest chain
    of messages one after another (what the latency is paid for).
    """

    loads: np.ndarray
    hops: int


def all_reduce_use(topology: str, hosts: Sequence[int], nbytes: float) -> LinkUse:
    """An all-reduce of ``nbytes`` on ``topology``: each pair's piece on its reduce and broadcast edges.

    Example:
        >>> all_reduce_use("STAR", (0, 0, 0), 12.0).loads.tolist()
        [[0.0, 12.0, 12.0], [12.0, 0.0, 0.0], [12.0, 0.0, 0.0]]
    """
    pairs = all_reduce_pairs(topology, hosts)
    n = len(hosts)
    loads = np.zeros((n, n))
    piece = nbytes / len(pairs)
    for p in pairs:
        for i, j in p.reduce_edges() + p.broadcast_edges():
            loads[i, j] += piece
    hops = max(_depth(p.reduce_parent) + _depth(p.broadcast_parent) for p in pairs)
    return LinkUse(loads, hops)


def rooted_use(topology: str, hosts: Sequence[int], root: int, nbytes: float, reduce: bool, broadcast: bool) -> LinkUse:
    """A reduce to (and/or broadcast from) ``root`` of ``nbytes``.

    Example:
        >>> rooted_use("STAR", (0, 0, 0), 2, 5.0, reduce=True, broadcast=False).loads[:, 2].tolist()
        [5.0, 5.0, 0.0]
    """
    p = rooted_pair(topology, hosts, root)
    n = len(hosts)
    loads = np.zeros((n, n))
    edges = (p.reduce_edges() if reduce else []) + (p.broadcast_edges() if broadcast else [])
    for i, j in edges:
        loads[i, j] += nbytes
    hops = (_depth(p.reduce_parent) if reduce else 0) + (_depth(p.broadcast_parent) if broadcast else 0)
    return LinkUse(loads, hops)


def all_gather_use(topology: str, hosts: Sequence[int], nbytes: float) -> LinkUse:
    """An all-gather of ``nbytes`` per rank: each rank's part broadcast over the pair rooted at it.

    Example:
        >>> all_gather_use("STAR", (0, 0), 3.0).loads.tolist()
        [[0.0, 3.0], [3.0, 0.0]]
    """
    n = len(hosts)
    loads = np.zeros((n, n))
    hops = 0
    for r in range(n):
        p = rooted_pair(topology, hosts, r)
        for i, j in p.broadcast_edges():
            loads[i, j] += nbytes
        hops = max(hops, _depth(p.broadcast_parent))
    return LinkUse(loads, hops)
