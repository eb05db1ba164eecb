"""The cost model against hand-computed references: all-reduce, PS owners, sparse rows, compression, hosts.

Each expected time is worked out here from the algorithm's traffic (how many
bytes leave the busiest rank or host, how many messages follow one another),
not from the model's code: a ring all-reduce sends 2(n-1)/n of the buffer
out of every rank in 2(n-1) steps, a star sends (n-1) buffers out of the
root, a PS owner receives one gradient from every other rank and sends its
value to each.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kungfu_tf.strategy import format as strategy_format
from kungfu_tf.strategy.auto.cost_model import COMPONENTS, CostModel
from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.builders import build
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.variable_info import VariableInfo

BW = 1e9  # bytes/s
LAT = 1e-4  # s
B = 4_000_000  # bytes of the test variable
W = VariableInfo("w", (1000, 1000))  # 4 MB float32
EXACT = {"rel": 1e-9}


def one_variable(topology: str = "", compressor: str = "", replicas: int = 0):
    return strategy_format.parse(
        f'graph_config {{ replicas: {replicas} }}'
        f' node_config {{ var_name: "w" all_reduce {{ topology: "{topology}" compressor: "{compressor}" }} }}'
    )


def model(**kw) -> CostModel:
    """Transfers only: no fixed cost per tensor, no optimizer update (tested on their own below)."""
    return CostModel(op_overhead=0.0, apply_passes=0.0, **kw)


def test_all_reduce_on_two_workers():
    cost = model().predict(one_variable(), [W], ClusterSpec(2), LinkRates.uniform(2, BW, LAT))
    # Each rank sends the whole buffer once (n = 2: 2(n-1)/n = 1), in two messages one after the other.
    assert cost.sync_time == pytest.approx(B / BW + 2 * LAT, **EXACT)
    assert cost.as_dict()["ar_bandwidth"] == pytest.approx(B / BW, **EXACT)
    assert cost.as_dict()["ar_latency"] == pytest.approx(2 * LAT, **EXACT)


@pytest.mark.parametrize(
    "topology,expected",
    [
        ("RING", 2 * 3 / 4 * B / BW + 2 * 3 * LAT),  # reduce-scatter + all-gather: 2(n-1) steps
        ("STAR", 3 * B / BW + 2 * LAT),  # the root sends the result to 3 ranks
        ("CLIQUE", 2 * 3 / 4 * B / BW + 2 * LAT),  # every rank is the root of a quarter
        ("", 2 * 3 / 4 * B / BW + 2 * LAT),  # AUTO: the fastest of the candidates, CLIQUE here
    ],
)
def test_all_reduce_on_four_workers(topology, expected):
    cost = model().predict(one_variable(topology), [W], ClusterSpec(4), LinkRates.uniform(4, BW, LAT))
    assert cost.sync_time == pytest.approx(expected, **EXACT)


def test_ps_owner_bottleneck():
    """Four equal variables on one owner load its links twice as much as one variable per owner."""
    vs = [VariableInfo(f"v{i}", (1000, 1000)) for i in range(4)]
    cluster = ClusterSpec(4)
    rates = LinkRates.uniform(4, BW, LAT)
    cm = model(job_topology="STAR")
    one_owner = cm.predict(build("PS", vs, cluster), vs, cluster, rates)
    spread = cm.predict(build("PSLoadBalancing", vs, cluster), vs, cluster, rates)
    # One owner receives 3 gradients and sends 3 values per variable: 12 buffers each way.
    assert one_owner.as_dict()["ps_bandwidth"] == pytest.approx(12 * B / BW, **EXACT)
    assert one_owner.bottleneck in ("rank 0 in", "rank 0 out")
    # Spread: each rank sends its 3 gradients to the other owners and its value to 3 ranks.
    assert spread.as_dict()["ps_bandwidth"] == pytest.approx(6 * B / BW, **EXACT)
    # Two messages in sequence (push, then value) of one hop each, per variable.
    assert one_owner.as_dict()["ps_latency"] == pytest.approx(4 * 2 * LAT, **EXACT)
    assert spread.as_dict()["ps_latency"] == pytest.approx(4 * 2 * LAT, **EXACT)


def test_slow_cross_host_link_changes_the_ranking():
    """Two hosts: at equal link speeds CLIQUE (2 hops) beats RING (6 hops) on a 200 KB buffer;
    with the link between hosts 10x slower, RING (fewer bytes across) wins."""
    small = VariableInfo("w", (50_000,))  # 200 KB
    b = small.nbytes
    cluster = ClusterSpec(4, hosts=(0, 0, 1, 1))
    even = LinkRates.uniform(4, BW, LAT, hosts=cluster.hosts)
    slow = LinkRates.uniform(4, BW, LAT, hosts=cluster.hosts, cross_host_bandwidth=BW / 10)
    cm = model()
    clique, ring = one_variable("CLIQUE"), one_variable("RING")
    # CLIQUE: host 0's two ranks each send a quarter to both remote roots, and as roots send their
    # quarter to both remote ranks: 8 quarters = 2 buffers leave host 0 (through its one interface).
    # RING crosses between hosts on one edge each way: 2(n-1)/n = 1.5 buffers.
    for rates, cross in ((even, BW), (slow, BW / 10)):
        assert cm.predict(clique, [small], cluster, rates).sync_time == pytest.approx(2 * b / cross + 2 * LAT, **EXACT)
        assert cm.predict(ring, [small], cluster, rates).sync_time == pytest.approx(1.5 * b / cross + 6 * LAT, **EXACT)
    assert cm.predict(clique, [small], cluster, even).sync_time < cm.predict(ring, [small], cluster, even).sync_time
    assert cm.predict(ring, [small], cluster, slow).sync_time < cm.predict(clique, [small], cluster, slow).sync_time
    assert cm.predict(clique, [small], cluster, slow).bottleneck == "host 0 out"


def test_compression_halves_the_bytes_and_costs_two_passes():
    copy = 2e9
    cm = model(copy_bandwidth=copy)
    rates = LinkRates.uniform(2, BW, LAT)
    plain = cm.predict(one_variable(), [W], ClusterSpec(2), rates).as_dict()
    fp16 = cm.predict(one_variable(compressor="fp16"), [W], ClusterSpec(2), rates).as_dict()
    assert fp16["ar_bandwidth"] == pytest.approx(plain["ar_bandwidth"] / 2, **EXACT)
    assert fp16["local_overhead"] == pytest.approx(2 * B / copy, **EXACT)
    assert plain["local_overhead"] == 0.0


def test_sparse_rows_are_all_gathered():
    emb = VariableInfo("emb", (100_000, 16), sparse=True)
    s = strategy_format.parse('node_config { var_name: "emb" all_reduce {} }')
    cost = model(rows_per_step=100).predict(s, [emb], ClusterSpec(2), LinkRates.uniform(2, BW, LAT)).as_dict()
    # Three all-gathers (count, int32 indices, float32 rows): each rank sends its part to the other.
    assert cost["sparse_bandwidth"] == pytest.approx((4 + 100 * 4 + 100 * 16 * 4) / BW, **EXACT)
    assert cost["ar_latency"] == pytest.approx(3 * LAT, **EXACT)
    assert cost["ar_bandwidth"] == 0.0


def test_sparse_ps_owner_compares_its_table():
    emb = VariableInfo("emb", (100_000, 16), sparse=True)  # 6.4 MB
    copy = 4e9
    cost = model(copy_bandwidth=copy, rows_per_step=100).predict(
        build("PS", [emb], ClusterSpec(2)), [emb], ClusterSpec(2), LinkRates.uniform(2, BW, LAT)
    )
    # The owner's snapshot and comparison read the table three times; then the changed rows (2 x 100) go out.
    assert cost.as_dict()["local_overhead"] == pytest.approx(3 * emb.nbytes / copy, **EXACT)
    gathered = 4 + 100 * 4 + 100 * 64
    published = 4 + 200 * 4 + 200 * 64
    assert cost.as_dict()["sparse_bandwidth"] == pytest.approx((gathered + published) / BW, **EXACT)


def test_variable_shares_add_up_and_follow_the_model_order():
    vs = [VariableInfo("a", (500, 500)), VariableInfo("b", (10,)), VariableInfo("emb", (5000, 8), sparse=True)]
    cluster = ClusterSpec(4, hosts=(0, 0, 1, 1))
    rates = LinkRates.uniform(4, BW, LAT, hosts=cluster.hosts, cross_host_bandwidth=BW / 8)
    for builder in ("AllReduce", "PS", "PartitionedPS", "Parallax"):
        cost = CostModel().predict(build(builder, vs, cluster), vs, cluster, rates)
        assert [v.var_name for v in cost.variables] == ["a", "b", "emb"]
        summed = np.sum([v.components for v in cost.variables], axis=0)
        assert summed == pytest.approx(cost.components, rel=1e-12)
        assert cost.sync_time == pytest.approx(sum(v.total for v in cost.variables), rel=1e-12)
        assert all(x >= 0 and math.isfinite(x) for x in cost.components)
        assert len(cost.components) == len(COMPONENTS) == 6


def test_compute_time_adds_to_the_step():
    cost = model().predict(one_variable(), [W], ClusterSpec(2), LinkRates.uniform(2, BW, LAT), compute_time=0.5)
    assert cost.step_time == pytest.approx(0.5 + B / BW + 2 * LAT, **EXACT)


def test_one_worker_only_pays_local_work():
    cost = CostModel(op_overhead=1e-5, apply_passes=3, copy_bandwidth=2e9).predict(
        one_variable(), [W], ClusterSpec(1), LinkRates.uniform(1, BW, LAT)
    )
    assert cost.sync_time == pytest.approx(1e-5 + 3 * B / 2e9, **EXACT)
    assert cost.bottleneck == ""


def test_the_optimizer_update_runs_where_the_tensor_is_held():
    """All-reduce: every rank updates all 4 variables; PS spread: each owner updates one."""
    vs = [VariableInfo(f"v{i}", (1000, 1000)) for i in range(4)]
    cluster, rates, copy = ClusterSpec(4), LinkRates.uniform(4, BW, LAT), 2e9
    cm = CostModel(op_overhead=0.0, apply_passes=5, copy_bandwidth=copy)
    ar = cm.predict(build("AllReduce", vs, cluster), vs, cluster, rates)
    ps = cm.predict(build("PSLoadBalancing", vs, cluster), vs, cluster, rates)
    one_owner = cm.predict(build("PS", vs, cluster), vs, cluster, rates)
    assert ar.as_dict()["local_overhead"] == pytest.approx(4 * 5 * B / copy, **EXACT)
    assert ps.as_dict()["local_overhead"] == pytest.approx(5 * B / copy, **EXACT)
    assert one_owner.as_dict()["local_overhead"] == pytest.approx(4 * 5 * B / copy, **EXACT)


def test_ranks_sharing_cores_add_up_their_local_work():
    """4 ranks on 2 cores: all-reduce's 4 replicated updates take twice one rank's time; one PS owner's do not."""
    vs = [VariableInfo(f"v{i}", (1000, 1000)) for i in range(4)]
    cluster, rates, copy = ClusterSpec(4), LinkRates.uniform(4, BW, LAT), 2e9
    cm = CostModel(op_overhead=0.0, apply_passes=5, copy_bandwidth=copy, cores_per_host=2)
    ar = cm.predict(build("AllReduce", vs, cluster), vs, cluster, rates)
    ps = cm.predict(build("PS", vs, cluster), vs, cluster, rates)
    assert ar.as_dict()["local_overhead"] == pytest.approx(4 * 4 * 5 * B / copy / 2, **EXACT)
    assert ps.as_dict()["local_overhead"] == pytest.approx(4 * 5 * B / copy, **EXACT)  # one busy rank, one core
    assert sum(v.components[-1] for v in ar.variables) == pytest.approx(ar.components[-1], **EXACT)


def test_bad_input_is_a_precise_error():
    rates = LinkRates.uniform(2, BW, LAT)
    with pytest.raises(StrategyError, match="the model has no trainable variables"):
        CostModel().predict(one_variable(), [], ClusterSpec(2), rates)
    with pytest.raises(StrategyError, match="link rates describe 2 ranks .* but the cluster has 4 replicas"):
        CostModel().predict(one_variable(), [W], ClusterSpec(4), rates)
    with pytest.raises(StrategyError, match="measured on np=2 hosts=0,0, the cluster is np=2 hosts=0,1"):
        CostModel().predict(one_variable(), [W], ClusterSpec(2, hosts=(0, 1)), rates)
    with pytest.raises(StrategyError, match="strategy written for 4 replicas, job has 2"):
        CostModel().predict(one_variable(replicas=4), [W], ClusterSpec(2), rates)
    with pytest.raises(StrategyError, match="bandwidth from rank 0 to rank 1 is 0.0; it must be > 0"):
        LinkRates((0, 0), [[0, 0], [1, 0]], [[0, 0], [0, 0]])
