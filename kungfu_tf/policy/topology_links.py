"""Which links each all-reduce topology loads, and the candidates ranked by measured link rates (KungFu §6.2 (2)).

``link_loads`` mirrors ops/runtime/topology.cc: a topology is a list of
graph pairs (a reduce tree and a broadcast tree); a tensor is cut into one
piece per pair, and every edge of a pair carries that pair's piece. The load
of link i-j is the bytes it carries per all-reduce, both directions summed
(as ``comm_rates`` counts sent + received), in units of the tensor's size.

Example:
    >>> link_loads("STAR", ["a", "a", "b"]).tolist()   # every worker to rank 0 and back
    [[0.0, 2.0, 2.0], [2.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _star(n: int, root: int) -> list[int]:
    return [-1 if i == root else root for i in range(n)]


def _binary_tree(members: Sequence[int], parent: list[int]) -> None:
    for i in range(1, len(members)):
        parent[members[i]] = members[(i - 1) // 2]


def _binary_tree_star(hosts: Sequence[str]) -> list[int]:
    """Star inside each host to its first rank, binary tree over those (hosts in order of first rank)."""
    groups: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        groups.setdefault(host, []).append(rank)
    parent = [-1] * len(hosts)
    for ranks in groups.values():
        for r in ranks[1:]:
            parent[r] = ranks[0]
    _binary_tree([ranks[0] for ranks in groups.values()], parent)
    return parent


def link_loads(topology: str, hosts: Sequence[str]) -> np.ndarray:
    """[n, n] symmetric: the share of an all-reduced tensor link i-j carries (sent + received), by rank.

    ``hosts``: each rank's host, in rank order (BINARY_TREE_STAR groups by
    it). AUTO counts as its choice for large tensors (RING across hosts,
    CLIQUE on one host), which carry the gradients' bytes.
    """
    n = len(hosts)
    if topology == "AUTO":
        topology = "RING" if len(set(hosts)) > 1 else "CLIQUE"
    loads = np.zeros((n, n))
    edges: list[tuple[int, int]] = []  # one per edge of every pair: reduce and broadcast alike
    if topology in ("STAR", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE"):
        if topology == "STAR":
            trees = [_star(n, 0)]
        elif topology == "BINARY_TREE":
            trees = [[-1] * n]
            _binary_tree(range(n), trees[0])
        elif topology == "BINARY_TREE_STAR":
            trees = [_binary_tree_star(hosts)]
        else:
            trees = [_star(n, r) for r in range(n)]
        for parent in trees:
            edges += [(i, p) for i, p in enumerate(parent) if p >= 0] * 2  # up to the root, then back down
        pairs = len(trees)
    elif topology == "RING":
        # Chain rooted at r: reduce r+1 -> ... -> r, broadcast r -> ... -> r-1.
        for r in range(n):
            edges += [((r + k) % n, (r + k + 1) % n) for k in range(1, n)]
            edges += [((r + k) % n, (r + k + 1) % n) for k in range(n - 1)]
        pairs = n
    else:
        raise ValueError(f"link_loads: unknown topology {topology!r}")
    for i, j in edges:
        loads[i, j] += 1.0 / pairs
        loads[j, i] += 1.0 / pairs
    return loads


def link_speeds(rates: np.ndarray, loads: np.ndarray) -> np.ndarray:
    """[n, n]: how fast each link moved its share (bytes/s per unit of load); NaN where not measured.

    ``rates[i, j]``: worker i's rate with peer j (a row per worker, as
    gathered); both ends count the same bytes, so their mean is the link's.
    Dividing by the load the topology in force gave the link makes a link
    that carried twice the bytes in the same time count as no faster.
    """
    rates = np.where(np.isfinite(rates) & (rates > 0), rates, 0.0)
    ends = (rates > 0).astype(np.float64) + (rates.T > 0)  # the ends that measured the link
    link = (rates + rates.T) / np.maximum(ends, 1.0)
    return np.where((ends > 0) & (loads > 0), link / np.where(loads > 0, loads, 1.0), np.nan)


def rank_candidates(
    candidates: Sequence[str], speeds: np.ndarray, hosts: Sequence[str], slow: float
) -> tuple[list[str], list[tuple[int, int]]]:
    """The candidates that avoid every slow link, best first, and the slow links (i < j).

    A link is slow when its speed is below ``slow`` times the fastest
    measured link's. A candidate's cost is the time its busiest link needs
    for its share: max over the links it uses of load / speed (a link not
    measured counts as the median of the links that are not slow). Without a
    slow link (or a measured one) the candidates come back in their order;
    when every candidate uses a slow link, all come back, cheapest first.
    Ties keep the given order, so every worker ranks alike.
    """
    n = len(hosts)
    measured = speeds[np.isfinite(speeds)]
    if n < 2 or measured.size == 0 or slow <= 0:
        return list(candidates), []
    threshold = slow * float(measured.max())
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    slow_links = [(i, j) for i, j in pairs if np.isfinite(speeds[i, j]) and speeds[i, j] < threshold]
    if not slow_links:
        return list(candidates), []
    assumed = float(np.median(measured[measured >= threshold]))
    known = np.where(np.isfinite(speeds), speeds, assumed)
    costs, avoiding = {}, []
    for name in candidates:
        loads = link_loads(name, hosts)
        used = loads > 0
        costs[name] = float(np.max(loads[used] / known[used])) if used.any() else 0.0
        if not any(used[i, j] for i, j in slow_links):
            avoiding.append(name)
    order = sorted(avoiding or candidates, key=lambda c: (costs[c], list(candidates).index(c)))
    return order, slow_links
