"""AdaptiveTopologyPolicy ranks its candidates by the gathered link rates (KungFu §6.2 (2)); no workers.

The link loads mirror ops/runtime/topology.cc; the policy runs on fake
contexts, one per rank, whose all_gather hands back every rank's rates.
"""

from __future__ import annotations

import numpy as np
import pytest

from kungfu_tf.policy import AdaptiveTopologyPolicy
from kungfu_tf.policy.topology_links import link_loads, link_speeds, rank_candidates

TWO_HOSTS = ["a", "a", "b", "b"]  # ranks 0, 1 on host a; 2, 3 on host b


def links(loads: np.ndarray) -> set[tuple[int, int]]:
    return {(i, j) for i, j in zip(*np.nonzero(loads)) if i < j}


def test_link_loads_follow_the_runtime_graphs():
    assert links(link_loads("STAR", TWO_HOSTS)) == {(0, 1), (0, 2), (0, 3)}
    assert links(link_loads("RING", TWO_HOSTS)) == {(0, 1), (1, 2), (2, 3), (0, 3)}
    assert links(link_loads("BINARY_TREE", TWO_HOSTS)) == {(0, 1), (0, 2), (1, 3)}  # heap order from rank 0
    assert links(link_loads("BINARY_TREE_STAR", TWO_HOSTS)) == {(0, 1), (2, 3), (0, 2)}  # one link across hosts
    assert links(link_loads("CLIQUE", TWO_HOSTS)) == {(i, j) for i in range(4) for j in range(i + 1, 4)}
    # Bytes per link, in tensor sizes, sent + received: a tree edge carries the tensor up and back down;
    # RING's n chains 2(n-1)/n (bandwidth-optimal); CLIQUE's n stars 4/n.
    assert link_loads("STAR", TWO_HOSTS)[0, 3] == 2.0
    assert link_loads("RING", TWO_HOSTS)[1, 2] == pytest.approx(1.5)
    assert link_loads("CLIQUE", TWO_HOSTS)[1, 3] == pytest.approx(1.0)
    np.testing.assert_allclose(link_loads("AUTO", TWO_HOSTS), link_loads("RING", TWO_HOSTS))  # large tensors
    np.testing.assert_allclose(link_loads("AUTO", ["a"] * 4), link_loads("CLIQUE", ["a"] * 4))
    for name in ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE"):
        loads = link_loads(name, ["h"] * 5)
        np.testing.assert_allclose(loads, loads.T)
        # Every rank's tensor reaches the others and comes back: each rank sends + receives >= 2 tensor sizes / n.
        assert (loads.sum(axis=1) > 0).all(), name


def test_speeds_are_rates_per_byte_of_the_links_share():
    loads = link_loads("STAR", ["h"] * 3)  # links 0-1, 0-2, each 2 tensor sizes
    rates = np.array([[0.0, 200.0, 100.0], [200.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # rank 2 measured nothing
    speeds = link_speeds(rates, loads)
    assert speeds[0, 1] == speeds[1, 0] == 100.0
    assert speeds[0, 2] == 50.0  # one end's view is enough
    assert np.isnan(speeds[1, 2])  # not used by STAR: not measured


def uniform_rates(topology: str, hosts: list[str], slow: dict[tuple[int, int], float]) -> np.ndarray:
    """What comm_rates reports when every link moves its share in the same time, but the ``slow`` ones."""
    rates = link_loads(topology, hosts) * 1e6
    for (i, j), factor in slow.items():
        rates[i, j] *= factor
        rates[j, i] *= factor
    return rates


def test_a_slow_link_ranks_the_topologies_that_avoid_it_first():
    # On one host, CLIQUE in force: link 1-2 moves its share at a tenth of the others' speed.
    hosts = ["h"] * 4
    speeds = link_speeds(uniform_rates("CLIQUE", hosts, {(1, 2): 0.1}), link_loads("CLIQUE", hosts))
    order, slow = rank_candidates(["RING", "STAR", "BINARY_TREE", "BINARY_TREE_STAR"], speeds, hosts, 0.5)
    assert slow == [(1, 2)]
    assert order == ["STAR", "BINARY_TREE", "BINARY_TREE_STAR"]  # RING uses 1-2; the rest tie, in given order
    # No slow link, or none measured: the given order.
    even = link_speeds(uniform_rates("CLIQUE", hosts, {}), link_loads("CLIQUE", hosts))
    assert rank_candidates(["RING", "STAR"], even, hosts, 0.5) == (["RING", "STAR"], [])
    unmeasured = link_speeds(np.zeros((4, 4)), link_loads("CLIQUE", hosts))
    assert rank_candidates(["RING", "STAR"], unmeasured, hosts, 0.5) == (["RING", "STAR"], [])
    # Every candidate uses the slow link: all are tried, cheapest first (RING puts 1.5 sizes on it, STAR 2).
    speeds = link_speeds(uniform_rates("CLIQUE", hosts, {(0, 1): 0.1}), link_loads("CLIQUE", hosts))
    assert rank_candidates(["STAR", "RING"], speeds, hosts, 0.5) == (["RING", "STAR"], [(0, 1)])


def test_avoiding_candidates_go_cheapest_first_by_the_bytes_on_their_busiest_link():
    # Two hosts, RING in force, the cross-host link 0-3 slow: BINARY_TREE and BINARY_TREE_STAR avoid it.
    speeds = link_speeds(uniform_rates("RING", TWO_HOSTS, {(0, 3): 0.2}), link_loads("RING", TWO_HOSTS))
    candidates = ["STAR", "BINARY_TREE_STAR", "BINARY_TREE", "CLIQUE"]
    assert rank_candidates(candidates, speeds, TWO_HOSTS, 0.5) == (["BINARY_TREE_STAR", "BINARY_TREE"], [(0, 3)])
    # Five workers, STAR in force, 0-3 slow: RING (1.6 tensor sizes per link) before BINARY_TREE (2), both
    # avoiding it; the links STAR does not use count as fast as the median normal one.
    hosts = ["h"] * 5
    speeds = link_speeds(uniform_rates("STAR", hosts, {(0, 3): 0.1}), link_loads("STAR", hosts))
    order, slow = rank_candidates(["BINARY_TREE", "CLIQUE", "RING", "BINARY_TREE_STAR"], speeds, hosts, 0.5)
    assert (order, slow) == (["RING", "BINARY_TREE"], [(0, 3)])


class RankContext:
    """One rank of a fake cluster: the policy's all_reduce and all_gather see every rank's values."""

    def __init__(self, rank: int, hosts: list[str], gathered: np.ndarray, topology: str):
        self.rank, self.size, self.topology = rank, len(hosts), topology
        self.peers = tuple(f"{h}:{10000 + r}" for r, h in enumerate(hosts))
        self.batch_size, self.step, self.epoch = 64, 0, 0
        self.gathered, self.gathers = gathered, 0
        self.metrics: dict = {}
        self.requests: list[tuple[str, str]] = []

    def all_reduce(self, value, op="mean", name=None):
        return value  # every rank measures the same throughput here

    def all_gather(self, value, name=None):
        # Each rank sends its window's mean rates; the gather returns them all, stacked by rank.
        np.testing.assert_allclose(value, self.gathered[self.rank])
        self.gathers += 1
        return self.gathered.copy()

    def set_topology(self, name, reason=""):
        self.requests.append((name, reason))
        self.topology = name


def drive(policy: AdaptiveTopologyPolicy, ctx: RankContext, rates: np.ndarray, steps: int) -> None:
    """Throughput 100 for a window, then 50; each step reports this rank's row of ``rates``."""
    for step in range(steps):
        ctx.step = step
        ctx.metrics = {"throughput": 100.0 if step < policy.window else 50.0, "link_rates": list(rates[ctx.rank])}
        policy.after_step(ctx)


def test_policy_tries_the_topology_that_avoids_the_slow_link_first_on_every_rank():
    hosts = ["h"] * 4
    # Each rank's view differs a little (its own clock); rank 2 saw link 1-2 at 0.15, rank 1 at 0.1 (the
    # link's speed is their mean).
    rates = uniform_rates("CLIQUE", hosts, {(1, 2): 0.1})
    rates[2, 1] *= 1.5
    rates = rates * (1 + 0.01 * np.arange(4))[:, None]
    firsts = []
    for rank in range(4):
        policy = AdaptiveTopologyPolicy(candidates=("RING", "STAR", "BINARY_TREE", "CLIQUE"), window=3, trial_steps=2)
        ctx = RankContext(rank, hosts, rates, "CLIQUE")
        drive(policy, ctx, rates, 2 * policy.window)
        assert ctx.gathers == 1  # once, when the trial starts
        firsts.append((ctx.requests, list(policy._queue)))
    assert all(f == firsts[0] for f in firsts), firsts  # identical everywhere: the agreement would raise otherwise
    requests, queue = firsts[0]
    assert [name for name, _ in requests] == ["STAR"]
    assert queue == ["BINARY_TREE", "CLIQUE"]  # RING (uses 1-2) is not tried; the current one last
    assert requests[0][1].endswith(": trying (comm rates: slow links 1-2 at 0.12x the fastest; not trying RING)")


def test_policy_keeps_the_given_order_without_rates_or_a_slow_link():
    hosts = TWO_HOSTS
    for rates in (np.zeros((4, 4)), uniform_rates("RING", hosts, {})):
        policy = AdaptiveTopologyPolicy(candidates=("CLIQUE", "STAR", "RING", "BINARY_TREE_STAR"), window=3)
        ctx = RankContext(0, hosts, rates, "RING")
        drive(policy, ctx, rates, 2 * policy.window)
        assert [n for n, _ in ctx.requests] == ["CLIQUE"] and policy._queue == ["STAR", "BINARY_TREE_STAR", "RING"]
    # No link_rates in the metrics at all (a context without the runner's monitor): zeros are gathered.
    policy = AdaptiveTopologyPolicy(candidates=("CLIQUE", "STAR"), window=2)
    ctx = RankContext(0, hosts, np.zeros((4, 4)), "RING")
    for throughput in (100.0, 100.0, 50.0, 50.0):
        ctx.metrics = {"throughput": throughput}
        policy.after_step(ctx)
    assert [n for n, _ in ctx.requests] == ["CLIQUE"] and ctx.gathers == 1
    # slow_link=0: no ranking, no gather.
    policy = AdaptiveTopologyPolicy(candidates=("RING", "STAR", "CLIQUE"), window=3, slow_link=0)
    rates = uniform_rates("CLIQUE", ["h"] * 4, {(1, 2): 0.1})
    ctx = RankContext(0, ["h"] * 4, rates, "CLIQUE")
    drive(policy, ctx, rates, 2 * policy.window)
    assert [n for n, _ in ctx.requests] == ["RING"] and ctx.gathers == 0
    with pytest.raises(ValueError, match=r"slow_link must be a number in \[0, 1\), got 1"):
        AdaptiveTopologyPolicy(slow_link=1)
