"""AutoDist's predefined simulator: a strategy's per-iteration synchronisation time, per variable and component.

Every synchronised tensor of a strategy (a variable, or a shard of one) is
turned into the messages the compiler sends for it (kungfu_tf/strategy/compiler.py):

* all-reduce, dense: one ``group_all_reduce`` per merge group (and per
  reduction: compressed shares are summed in a collective of their own), of
  the group's wire bytes, on the group's topology;
* all-reduce, sparse (an embedding's ``IndexedSlices``): three all-gathers
  (row count, row indices, row values) of the rows one worker touches;
* parameter server, dense: a reduce of the gradient to the owner, then a
  broadcast of the new value from it (on the job's topology);
* parameter server, sparse: the three all-gathers, then three broadcasts of
  the rows the owner's update changed;
* stale or asynchronous PS: a push to the owner and a fetch from it, point to
  point (a star around the owner).

Each message loads directed links (:mod:`~kungfu_tf.strategy.auto.link_graphs`,
the runtime's own graphs). An AUTO topology is priced as the candidate that
would finish that message soonest alone, which is what the runtime's AUTO
probe picks. All messages of a step are in flight together, so bytes add up
on shared resources: every directed link (its measured bandwidth), every
rank's sending and receiving side (a rank moves bytes no faster than over
its fastest link) and, across hosts, every host's way out and in (all its
ranks share one network interface). The busiest resource bounds the step.

The six components (AutoDist's z_predefined; the paper's appendix that lists
its own is not in our copy, so these are ours, one per term of the
synchronisation expressions above), in seconds per iteration:

1. ``ar_bandwidth``: the time the all-reduced dense bytes occupy the
   busiest resource (compression shrinks them to the wire dtype);
2. ``ar_latency``: per all-reduce and sparse all-gather message, its hops in
   sequence (tree depth up and down, or a chain's length) times the slowest
   latency on its links; one per merge group, so merging saves it;
3. ``ps_bandwidth``: the time the dense PS bytes (pushes to owners, values
   from owners) occupy the busiest resource: an overloaded owner shows here;
4. ``ps_latency``: as 2, for the PS messages (two per tensor, in sequence);
5. ``sparse_bandwidth``: the time the rows of sparse gradients (and the
   changed rows an owner publishes) occupy the busiest resource;
6. ``local_overhead``: work on the busiest worker that is not a transfer: the
   optimizer update (``apply_passes`` over the tensor, on every rank for an
   all-reduced tensor but on its owner alone for a PS one: the work PS
   spreads), a fixed cost per synchronised tensor (ops, dispatch), copies
   for cutting a gradient into shards and stitching them back, the casts of
   a compressor (two passes), and on a PS owner the refresh of its shard
   variable (one pass) or, for a sparse table, the snapshot and comparison
   that find the rows its update changed (three passes over the table).
   When a host has fewer cores than ranks (``cores_per_host``), its ranks'
   local work shares them, and the busiest host counts.

The sync time is their sum (AutoDist's linear combination with fixed
weights, all 1 here: every component is already in seconds), and the
predicted step time is the compute time plus the sync time (our kernels start
a collective when its gradient is ready, but a step ends with the last
collective, so the model assumes no overlap; a constant compute time does
not change the ranking anyway).

A variable's share: its bytes' time on the busiest resource, its share of
each message's latency (by bytes), and its own overhead, so that the
variables' costs add up to the total.

Example:
    >>> from kungfu_tf.strategy.builders import build
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> from kungfu_tf.strategy.auto.cost_model import CostModel
    >>> from kungfu_tf.strategy.auto.link_rates import LinkRates
    >>> vs = [VariableInfo("w", (1000, 250))]  # 1 MB
    >>> cluster = ClusterSpec(2)
    >>> rates = LinkRates.uniform(2, bandwidth=1e9, latency=1e-4)
    >>> transfers_only = CostModel(op_overhead=0.0, apply_passes=0.0)
    >>> cost = transfers_only.predict(build("AllReduce", vs, cluster), vs, cluster, rates)
    >>> round(cost.sync_time, 6)  # 1 MB out of each rank at 1 GB/s, then 2 hops of 100 us
    0.0012
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.link_graphs import (
    LinkUse,
    all_gather_use,
    all_reduce_use,
    auto_candidates,
    rooted_use,
)
from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.resolved_node import ResolvedNode
from kungfu_tf.strategy.validation import effective_nodes
from kungfu_tf.strategy.variable_info import VariableInfo

COMPONENTS: tuple[str, ...] = (
    "ar_bandwidth",
    "ar_latency",
    "ps_bandwidth",
    "ps_latency",
    "sparse_bandwidth",
    "local_overhead",
)
_INDEX = {name: i for i, name in enumerate(COMPONENTS)}
# Row indices of an IndexedSlices travel as int32 (ops/indexed_slices.py pads and gathers them as given;
# Keras embeddings look up int32 ids).
_INDEX_BYTES = 4
_COUNT_BYTES = 4


@dataclass(frozen=True)
class VariableCost:
    """One variable's predicted share of the sync time, per component (seconds).

    Example:
        >>> c = VariableCost("w", (0.5, 0.1, 0.0, 0.0, 0.0, 0.01))
        >>> c.total, c.as_dict()["ar_latency"]
        (0.61, 0.1)
    """

    var_name: str
    components: tuple[float, ...]

    @property
    def total(self) -> float:
        """Sum of the components."""
        return float(sum(self.components))

    def as_dict(self) -> dict[str, float]:
        """Component name -> seconds."""
        return dict(zip(COMPONENTS, self.components, strict=True))


@dataclass(frozen=True)
class CostBreakdown:
    """The cost model's prediction for one strategy.

    ``components`` are the six totals (seconds, in :data:`COMPONENTS` order),
    ``variables`` the per-variable shares (in the model's order), and
    ``bottleneck`` names the busiest resource (e.g. "rank 0 in", "link 1->2",
    "host 0 out"; "" when nothing crosses a link).

    Example:
        >>> b = CostBreakdown("s", (), (1.0, 0.5, 0.0, 0.0, 0.0, 0.25), compute_time=2.0)
        >>> b.sync_time, b.step_time, b.total, b.as_dict()["ar_latency"]
        (1.75, 3.75, 3.75, 0.5)
    """

    strategy_id: str
    variables: tuple[VariableCost, ...]
    components: tuple[float, ...]
    compute_time: float = 0.0
    bottleneck: str = ""
    messages: int = 0

    @property
    def sync_time(self) -> float:
        """Predicted synchronisation time per iteration (seconds)."""
        return float(sum(self.components))

    @property
    def step_time(self) -> float:
        """Predicted time per iteration: compute + sync (seconds)."""
        return self.compute_time + self.sync_time

    @property
    def total(self) -> float:
        """The predicted time per iteration (:attr:`step_time`): what candidates are ranked by."""
        return self.step_time

    def as_dict(self) -> dict[str, float]:
        """Component name -> seconds."""
        return dict(zip(COMPONENTS, self.components, strict=True))

    def vector(self) -> np.ndarray:
        """The components as a float64 vector (AutoDist's z_predefined)."""
        return np.array(self.components, dtype=np.float64)


@dataclass
class _Message:
    """One collective (or p2p exchange) and the variables that pay for it."""

    bandwidth: str  # component its bytes count in
    latency: str  # component its hops count in
    use: LinkUse
    latency_s: float
    members: list[tuple[str, float]] = field(default_factory=list)  # (var_name, bytes)
    topology: str = ""  # a merge group's topology (its graphs are chosen once all members are known)


class _Resources:
    """Everything bytes queue for: directed links, each rank's two sides, each host's two sides."""

    def __init__(self, rates: LinkRates) -> None:
        self.bw = rates.bandwidth_matrix()
        self.lat = rates.latency_matrix()
        self.hosts = rates.hosts
        n = rates.replicas
        off = ~np.eye(n, dtype=bool)
        self.names: list[str] = []
        # Each resource: a mask over the [n, n] load matrix and a capacity (bytes/s).
        self.masks: list[np.ndarray] = []
        self.capacity: list[float] = []
        for i in range(n):
            for j in range(n):
                if i != j:
                    mask = np.zeros((n, n))
                    mask[i, j] = 1.0
                    self._add(f"link {i}->{j}", mask, self.bw[i, j])
        if n > 1:
            for r in range(n):
                out = np.zeros((n, n))
                out[r, :] = off[r, :]
                self._add(f"rank {r} out", out, float(np.max(self.bw[r][off[r]])))
                into = np.zeros((n, n))
                into[:, r] = off[:, r]
                self._add(f"rank {r} in", into, float(np.max(self.bw[:, r][off[:, r]])))
        hosts = np.array(self.hosts)
        if len(set(self.hosts)) > 1:
            for h in sorted(set(self.hosts)):
                inside = hosts == h
                leaving = np.outer(inside, ~inside).astype(np.float64)
                entering = np.outer(~inside, inside).astype(np.float64)
                self._add(f"host {h} out", leaving, float(np.max(self.bw[leaving > 0])))
                self._add(f"host {h} in", entering, float(np.max(self.bw[entering > 0])))
        self.stacked = np.stack(self.masks) if self.masks else np.zeros((0, n, n))
        self.cap = np.array(self.capacity, dtype=np.float64)

    def _add(self, name: str, mask: np.ndarray, capacity: float) -> None:
        self.names.append(name)
        self.masks.append(mask)
        self.capacity.append(capacity)

    def times(self, loads: np.ndarray) -> np.ndarray:
        """Seconds each resource needs for ``loads`` ([n, n] bytes)."""
        if not len(self.cap):
            return np.zeros(0)
        return np.einsum("kij,ij->k", self.stacked, loads) / self.cap

    def latency(self, use: LinkUse) -> float:
        """Hops in sequence times the slowest latency on the links the message uses."""
        used = use.loads > 0
        if not used.any():
            return 0.0
        return use.hops * float(np.max(self.lat[used]))

    def alone(self, use: LinkUse) -> float:
        """How long the message would take with the cluster to itself."""
        t = self.times(use.loads)
        return (float(t.max()) if t.size else 0.0) + self.latency(use)


# The message makers, with the topology last: each AUTO candidate is tried in turn.
def _all_reduce(hosts: Sequence[int], nbytes: float, topology: str) -> LinkUse:
    return all_reduce_use(topology, hosts, nbytes)


def _all_gather(hosts: Sequence[int], nbytes: float, topology: str) -> LinkUse:
    return all_gather_use(topology, hosts, nbytes)


def _rooted(hosts: Sequence[int], root: int, nbytes: float, reduce: bool, topology: str) -> LinkUse:
    """A reduce to ``root`` (``reduce``) or a broadcast from it."""
    return rooted_use(topology, hosts, root, nbytes, reduce=reduce, broadcast=not reduce)


class CostModel:
    """Predicts the per-iteration sync time of a strategy from the link rates.

    Args:
        rows_per_step: rows of a sparse variable one worker's gradient touches
            per step (an int for every sparse variable, or variable name ->
            rows); a shard along the rows gets its share, ids assumed spread
            evenly. Capped by the table's rows.
        op_overhead: fixed seconds per synchronised tensor (its ops and their dispatch).
        copy_bandwidth: bytes/s of one local pass over a tensor (slicing,
            stitching, casting to and from the wire dtype).
        job_topology: the job's topology, used by rooted operations (PS
            reduce and broadcast, all-gathers): "AUTO" (the default of
            ``kungfu-run``) or one of the fixed ones.
        apply_passes: passes over a tensor its optimizer update makes (read
            the gradient, the slots and the variable, write them back); paid
            by every rank for an all-reduced tensor, by the owner alone for a
            PS tensor (0: leave the update out).
        sparse_apply_dense: an embedding's update touches the whole table
            (true for optimizers with slots: momentum decays every row); False
            for plain SGD, whose update touches only the gathered rows.
        cores_per_host: cores the ranks of one host share (None: a core per
            rank); with fewer cores than ranks, a host's local work adds up.

    Example:
        >>> CostModel(rows_per_step={"emb": 64}).rows_for("emb", 1000)
        64
    """

    def __init__(
        self,
        rows_per_step: int | Mapping[str, int] = 256,
        op_overhead: float = 20e-6,
        copy_bandwidth: float = 4e9,
        job_topology: str = "AUTO",
        apply_passes: float = 4.0,
        sparse_apply_dense: bool = True,
        cores_per_host: int | None = None,
    ) -> None:
        if apply_passes < 0:
            raise ValueError(f"apply_passes must be >= 0, got {apply_passes}")
        if cores_per_host is not None and cores_per_host < 1:
            raise ValueError(f"cores_per_host must be >= 1, got {cores_per_host}")
        self.apply_passes = apply_passes
        self.sparse_apply_dense = sparse_apply_dense
        self.cores_per_host = cores_per_host
        if isinstance(rows_per_step, int) and rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1, got {rows_per_step}")
        if op_overhead < 0:
            raise ValueError(f"op_overhead must be >= 0 s, got {op_overhead}")
        if not copy_bandwidth > 0:
            raise ValueError(f"copy_bandwidth must be > 0 bytes/s, got {copy_bandwidth}")
        self.rows_per_step = rows_per_step
        self.op_overhead = op_overhead
        self.copy_bandwidth = copy_bandwidth
        self.job_topology = "AUTO" if job_topology in ("", "AUTO") else job_topology

    def rows_for(self, var_name: str, table_rows: int) -> int:
        """Rows of ``var_name`` one worker touches per step (at most ``table_rows``)."""
        if isinstance(self.rows_per_step, Mapping):
            rows = self.rows_per_step.get(var_name, 256)
        else:
            rows = self.rows_per_step
        return max(1, min(int(rows), table_rows))

    def predict(
        self,
        strategy: strategy_pb2.Strategy,
        variables: Sequence[VariableInfo],
        cluster: ClusterSpec,
        rates: LinkRates,
        compute_time: float = 0.0,
    ) -> CostBreakdown:
        """The predicted per-iteration costs of ``strategy`` for ``variables`` on ``cluster``.

        Raises StrategyError if the strategy does not fit the model or the
        cluster, or the rates describe another cluster.
        """
        if not variables:
            raise StrategyError("the model has no trainable variables; there is nothing to synchronise")
        if compute_time < 0:
            raise ValueError(f"compute_time must be >= 0 s, got {compute_time}")
        rates.check_cluster(cluster)
        nodes = effective_nodes(strategy, variables, cluster.replicas)
        resources = _Resources(rates)
        n = cluster.replicas
        per_var = {v.name: np.zeros(len(COMPONENTS)) for v in variables}
        local = {v.name: np.zeros(n) for v in variables}  # seconds of local work per rank
        messages: list[_Message] = []
        groups: dict[tuple[int, str], _Message] = {}

        for node in nodes:
            local[node.var_name] += self._overhead(node, n)
            if n == 1:
                continue  # one worker: nothing travels
            if node.kind == "all_reduce" and not self._travels_as_rows(node):
                assert node.group is not None and node.nbytes is not None
                op = "sum" if node.wire_dtype else "mean"
                wire = self._wire_bytes(node)
                message = groups.get((node.group, op))
                if message is None:
                    message = _Message(
                        "ar_bandwidth", "ar_latency", LinkUse(np.zeros((n, n)), 0), 0.0, topology=node.topology
                    )
                    groups[(node.group, op)] = message
                    messages.append(message)
                message.members.append((node.var_name, wire))
            elif node.kind == "all_reduce":
                messages.extend(self._sparse_gather(node, resources, "ar_latency"))
            elif not node.sync or node.staleness > 0:
                messages.extend(self._stale_ps(node, resources))
            elif self._travels_as_rows(node):
                messages.extend(self._sparse_gather(node, resources, "ps_latency"))
                messages.extend(self._publish_rows(node, resources, n))
            else:
                messages.extend(self._dense_ps(node, resources))

        for message in groups.values():
            total = sum(b for _, b in message.members)
            message.use = self._choose(message.topology, resources, partial(_all_reduce, rates.hosts, total))
            message.latency_s = resources.latency(message.use)

        loads = sum((m.use.loads for m in messages), np.zeros((n, n)))
        times = resources.times(loads)
        bottleneck = int(np.argmax(times)) if times.size and times.max() > 0 else None
        for m in messages:
            total = sum(b for _, b in m.members)
            share_bw = float(resources.times(m.use.loads)[bottleneck]) if bottleneck is not None else 0.0
            for var_name, b in m.members:
                weight = b / total if total > 0 else 1.0 / len(m.members)
                per_var[var_name][_INDEX[m.bandwidth]] += share_bw * weight
                per_var[var_name][_INDEX[m.latency]] += m.latency_s * weight

        for var_name, seconds in self._local_shares(local, rates.hosts).items():
            per_var[var_name][_INDEX["local_overhead"]] = seconds
        variable_costs = tuple(VariableCost(v.name, tuple(float(x) for x in per_var[v.name])) for v in variables)
        totals = tuple(float(sum(c.components[i] for c in variable_costs)) for i in range(len(COMPONENTS)))
        return CostBreakdown(
            strategy.id,
            variable_costs,
            totals,
            compute_time=float(compute_time),
            bottleneck=resources.names[bottleneck] if bottleneck is not None else "",
            messages=len(messages),
        )

    def _local_shares(self, local: dict[str, np.ndarray], hosts: Sequence[int]) -> dict[str, float]:
        """Each variable's share of the local work on the busiest rank, or busiest host when cores are shared."""
        n = len(hosts)
        per_rank = sum(local.values(), np.zeros(n))
        best_time, best_weights = 0.0, np.zeros(n)
        for h in sorted(set(hosts)):
            ranks = np.array([r for r in range(n) if hosts[r] == h])
            top = int(ranks[np.argmax(per_rank[ranks])])
            weights = np.zeros(n)
            weights[top] = 1.0
            time = float(per_rank[top])
            if self.cores_per_host is not None and len(ranks) > self.cores_per_host:
                shared = float(per_rank[ranks].sum()) / self.cores_per_host
                if shared > time:
                    weights = np.zeros(n)
                    weights[ranks] = 1.0 / self.cores_per_host
                    time = shared
            if time > best_time:
                best_time, best_weights = time, weights
        return {name: float(seconds @ best_weights) for name, seconds in local.items()}

    # -- one tensor's messages -------------------------------------------------

    @staticmethod
    def _travels_as_rows(node: ResolvedNode) -> bool:
        # compiler._rows_of: a sparse gradient stays rows unless its shard is cut across the rows.
        variable = node.variable
        return variable is not None and variable.sparse and (node.axis is None or node.axis == 0)

    @staticmethod
    def _wire_bytes(node: ResolvedNode) -> float:
        assert node.variable is not None and node.nbytes is not None
        if not node.wire_dtype:
            return float(node.nbytes)
        itemsize = np.dtype(node.variable.dtype).itemsize if node.variable.dtype != "bfloat16" else 2
        return node.nbytes / itemsize * 2  # fp16 and bf16 are both 2 bytes

    def _overhead(self, node: ResolvedNode, n: int) -> np.ndarray:
        """Seconds of local work the tensor costs each rank (the step waits for the busiest rank)."""
        nbytes = float(node.nbytes or 0)
        cost = np.full(n, self.op_overhead)
        rows_bytes = nbytes
        if self._travels_as_rows(node):
            rows, row_bytes = self._rows(node)
            rows_bytes = float(rows * row_bytes)
        if node.is_shard:
            cost += 2 * rows_bytes / self.copy_bandwidth  # the gradient cut into the shard, the value stitched back
        if node.wire_dtype:
            cost += 2 * nbytes / self.copy_bandwidth  # encode and decode
        if self.apply_passes:
            applied = nbytes
            if self._travels_as_rows(node) and not self.sparse_apply_dense:
                applied = rows_bytes * n  # every worker's rows, gathered
            update = self.apply_passes * applied / self.copy_bandwidth
            if node.kind == "all_reduce":
                cost += update  # every rank updates its replica
            elif node.owner is not None and node.owner < n:
                cost[node.owner] += update  # only the owner holds slots and updates
        if node.kind == "ps" and node.owner is not None and node.owner < n:
            if self._travels_as_rows(node):
                # The owner snapshots the table and compares it after its update to find the changed rows.
                cost[node.owner] += 3 * nbytes / self.copy_bandwidth
            elif node.is_shard:
                cost[node.owner] += nbytes / self.copy_bandwidth  # its shard variable refreshed from the model
        return cost

    def _rows(self, node: ResolvedNode) -> tuple[int, int]:
        """(rows one worker sends, bytes per row) for a sparse tensor."""
        assert node.variable is not None and node.nbytes is not None
        shape = node.shape or node.variable.shape
        table_rows = node.variable.shape[0]
        row_bytes = node.nbytes // max(1, shape[0])
        touched = self.rows_for(node.var_name, table_rows)
        if node.is_shard:
            touched = math.ceil(touched * shape[0] / table_rows)
        return max(1, min(touched, shape[0])), row_bytes

    def _candidates(self, topology: str, hosts: Sequence[int]) -> tuple[str, ...]:
        return auto_candidates(hosts) if topology in ("", "AUTO") else (topology,)

    def _choose(self, topology: str, resources: _Resources, make: Callable[[str], LinkUse]) -> LinkUse:
        uses = [make(t) for t in self._candidates(topology, resources.hosts)]
        return min(uses, key=resources.alone)  # the first on a tie, as the runtime's fastest()

    def _message(self, bandwidth: str, latency: str, use: LinkUse, resources: _Resources, member: tuple[str, float]) -> _Message:
        return _Message(bandwidth, latency, use, resources.latency(use), [member])

    def _sparse_gather(self, node: ResolvedNode, resources: _Resources, latency: str) -> list[_Message]:
        rows, row_bytes = self._rows(node)
        hosts = resources.hosts
        out = []
        for nbytes in (_COUNT_BYTES, rows * _INDEX_BYTES, rows * row_bytes):
            use = self._choose(self.job_topology, resources, partial(_all_gather, hosts, nbytes))
            out.append(self._message("sparse_bandwidth", latency, use, resources, (node.var_name, float(nbytes))))
        return out

    def _publish_rows(self, node: ResolvedNode, resources: _Resources, n: int) -> list[_Message]:
        rows, row_bytes = self._rows(node)
        shape = node.shape or ()
        changed = min(shape[0] if shape else rows, rows * n)  # plain SGD changes every touched row, no more
        hosts, owner = resources.hosts, node.owner
        assert owner is not None
        out = []
        for nbytes in (_COUNT_BYTES, changed * _INDEX_BYTES, changed * row_bytes):
            use = self._choose(self.job_topology, resources, partial(_rooted, hosts, owner, nbytes, False))
            out.append(self._message("sparse_bandwidth", "ps_latency", use, resources, (node.var_name, float(nbytes))))
        return out

    def _dense_ps(self, node: ResolvedNode, resources: _Resources) -> list[_Message]:
        nbytes = float(node.nbytes or 0)
        hosts, owner = resources.hosts, node.owner
        assert owner is not None
        out = []
        for reduce in (True, False):
            use = self._choose(self.job_topology, resources, partial(_rooted, hosts, owner, nbytes, reduce))
            out.append(self._message("ps_bandwidth", "ps_latency", use, resources, (node.var_name, nbytes)))
        return out

    def _stale_ps(self, node: ResolvedNode, resources: _Resources) -> list[_Message]:
        # Pushes and fetches go point to point between each worker and the owner: a star.
        hosts, owner = resources.hosts, node.owner
        assert owner is not None
        if self._travels_as_rows(node):
            rows, row_bytes = self._rows(node)
            nbytes = float(rows * (row_bytes + _INDEX_BYTES))
            bandwidth = "sparse_bandwidth"
        else:
            nbytes = float(node.nbytes or 0)
            bandwidth = "ps_bandwidth"
        return [
            self._message(
                bandwidth, "ps_latency", rooted_use("STAR", hosts, owner, nbytes, reduce=r, broadcast=not r),
                resources, (node.var_name, nbytes),
            )
            for r in (True, False)
        ]
