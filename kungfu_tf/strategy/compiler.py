"""The strategy compiler: rewrites one training step so that every variable follows its node.

AutoDist's local rewriting (papers/autodist-composable-sync.md §2.3): every
worker builds a :class:`StrategyPlan` from the same strategy and its own rank,
and the plan inserts the synchronisation of every (gradient, variable) pair
into the step while it is traced — a ``tf.function`` (Keras ``fit``, custom
loops) or a v1 graph. Per variable, the kernels compose as

    gradient ─ partitioner ─┬─ all-reduce shard: compressor → merge group → decompress ─┐
                            └─ PS shard: reduce to owner / push to owner ───────────────┤
                                                                                        ▼
       apply on this rank (the wrapped optimizer, only what this rank owns or replicates)
                                                                                        ▼
       PS values from their owners (broadcast / changed rows / p2p store) → stitch → variable

A partitioned variable whose shards are all all-reduced is stitched back
before the update (the optimizer sees the whole gradient). A partitioned
variable with PS shards gets one *shard variable* per shard on the rank that
updates it, so that the optimizer's slots exist only there, for that shard;
the shard variable is refreshed from the model variable before each update,
so assignments to the model (checkpoint restores) are never lost.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.strategy.builders import build
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.compiler import StrategyPlan
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> w = tf.Variable([1.0, 2.0], name="w")
    >>> plan = StrategyPlan(build("PS", [VariableInfo.from_variable(w)], ClusterSpec(1)), [w], name="doc")
    >>> [v.name for v in plan.targets]
    ['w:0']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf import ops
from kungfu_tf.ops import elastic_membership, p2p
from kungfu_tf.ops.call_names import call_prefix
from kungfu_tf.ops.indexed_slices import average_indexed_slices
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import plan_generation, stale_keys
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.kernels import ps_stale, ps_sync
from kungfu_tf.strategy.kernels.all_reduce_sync import GroupedAllReduce
from kungfu_tf.strategy.kernels.compressor import Compressor
from kungfu_tf.strategy.kernels.gradient_clip import GradientClip
from kungfu_tf.strategy.kernels.partitioner import slice_value, split_gradient, stitch
from kungfu_tf.strategy.resolved_node import ResolvedNode
from kungfu_tf.strategy.validation import effective_nodes
from kungfu_tf.strategy.variable_info import VariableInfo

Gradient = tf.Tensor | tf.IndexedSlices | None
# Applies the wrapped optimizer to (gradients, variables) on this rank.
ApplyFn = Callable[[list[Any], list[Any]], Any]
# Creates a variable (Keras or TF) from an initial value and a name.
VariableFactory = Callable[[tf.Tensor, str], Any]
# Observes the averaged gradients (one per variable, None kept) and the averaged rider.
ObserveFn = Callable[[list[Any], tf.Tensor], Any]


def _tf_variable(v: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a Keras 3 variable (for scatter updates)."""
    inner = getattr(v, "value", None)
    return inner if isinstance(inner, tf.Variable) else v


def _default_factory(initial_value: tf.Tensor, name: str) -> tf.Variable:
    # Zeros of the initial value's shape: shard variables are refreshed from
    # the model before every update and residuals start at zero anyway, and
    # in a v1 graph an initializer reading the model variable would depend on
    # that variable being initialised first.
    return tf.Variable(tf.zeros(initial_value.shape, initial_value.dtype), trainable=False, name=name)


@dataclass
class _Unit:
    """One synchronised tensor: a whole variable or one shard."""

    node: ResolvedNode
    target: Any = None  # what the optimizer updates on this rank, or None
    compressor: Compressor | None = None

    @property
    def stale(self) -> bool:
        return self.node.kind == "ps" and (not self.node.sync or self.node.staleness > 0)


@dataclass
class _VariablePlan:
    variable: Any
    units: list[_Unit]
    # "whole": not partitioned; "stitched": partitioned, all shards all-reduced
    # (stitched before the update); "shards": partitioned with PS shards.
    mode: str = "whole"
    axis: int = 0
    bounds: list[tuple[int, int]] = field(default_factory=list)

    @property
    def all_reduced(self) -> bool:
        return all(u.node.kind == "all_reduce" for u in self.units)


class StrategyPlan:
    """One rank's rewriting of the training step for ``strategy``.

    Args:
        strategy: the strategy (validated here against ``variables`` and the
            cluster size).
        variables: the model's trainable variables, in the order the
            optimizer receives them.
        name: message-key prefix; repeated plans in one graph are numbered.
        rank, size: this worker and the cluster size (default: the running job's).
        make_variable: creates shard variables and error-feedback residuals
            (a Keras optimizer passes one that makes ``keras.Variable``).

    Raises:
        StrategyError: the strategy does not fit the model or the cluster,
            or the workers do not all hold the same strategy.

    Example:
        >>> import tensorflow as tf
        >>> from kungfu_tf.strategy.builders import build
        >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
        >>> from kungfu_tf.strategy.variable_info import VariableInfo
        >>> w = tf.Variable(tf.ones([4, 2]), name="w")
        >>> s = build("AllReduce", [VariableInfo.from_variable(w)], ClusterSpec(1), compressor="bf16-ef")
        >>> plan = StrategyPlan(s, [w], name="doc2")
        >>> opt = tf.keras.optimizers.SGD(0.5)
        >>> _ = plan.step([tf.ones([4, 2])], lambda g, v: opt.apply_gradients(zip(g, v)))
        >>> w.numpy()[0].tolist()
        [0.5, 0.5]
    """

    def __init__(
        self,
        strategy: strategy_pb2.Strategy,
        variables: Sequence[Any],
        name: str = "kungfu_strategy",
        rank: int | None = None,
        size: int | None = None,
        make_variable: VariableFactory = _default_factory,
        serial: int = 0,
    ) -> None:
        import kungfu_tf

        self.strategy = strategy
        self.name = name
        # The plan's place in the optimizer's sequence of plans (agreed by every worker when a plan replaces
        # another; see _keys below).
        self.serial = serial
        self.rank = kungfu_tf.rank() if rank is None else rank
        self.size = kungfu_tf.size() if size is None else size
        infos = [VariableInfo.from_variable(v) for v in variables]
        resolved = effective_nodes(strategy, infos, replicas=self.size)
        by_var: dict[str, list[ResolvedNode]] = {}
        for node in resolved:
            by_var.setdefault(node.var_name, []).append(node)
        with tf.init_scope():
            # Created outside any tf.function being traced, once.
            self._plans = [self._plan_variable(v, by_var[i.name], make_variable) for v, i in zip(variables, infos)]
            self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_step")
        self._stale_k = [u.node.staleness for p in self._plans for u in p.units if u.stale and u.node.sync]
        self._has_stale = any(u.stale for p in self._plans for u in p.units)
        # A stale parameter server's blobs, accumulators and clocks live in the workers' stores, versioned by a
        # step count that restarts with each plan: a later plan's must not meet an earlier one's, and a replaced
        # plan's are forgotten by their prefix (strategy_replan.install_plan), which must not cover the next
        # plan's. Only there: a joiner keeps its own all-reduce plan (serial 0) where the members' is the same
        # (strategy_resize.py).
        self._keys = f"{name}/p{serial}" if self._has_stale else name
        if self._has_stale:
            stale_keys.claim(self._keys, self)
            self.forget_stored()  # a gone optimizer's of the same name; before the consensus lets a peer push
        self._checked_eagerly = self._check_identical_eagerly()
        # Slot replicas (keep_slot_replicas): kept or not, this rank's slots by target id, replicas by (vi, ui)
        # (None where a unit has no slot of a kind).
        self._keeps_slots = False
        # Kinds of slots the optimizer keeps per variable, agreed by every worker when it was built (replicas or
        # not): a change that loses an owner under PS, where no survivor holds a slot, still knows there were some.
        self.slot_kinds = 0
        self._slots_of: dict[int, list[Any]] = {}
        self.slot_replicas: dict[tuple[int, int], list[tf.Variable | None]] = {}
        # The plan is replaced at membership changes (elastic jobs) and at strategy switches (any TF2
        # job): steps check they are current. A v1 graph's plan is never replaced (no switch there).
        self.guarded = elastic_membership.is_elastic() or tf.compat.v1.executing_eagerly_outside_functions()

    # ----------------------------------------------------------------- set-up

    def _plan_variable(self, variable: Any, nodes: list[ResolvedNode], make_variable: VariableFactory) -> _VariablePlan:
        first = nodes[0]
        units = [_Unit(n) for n in nodes]
        plan = _VariablePlan(variable, units)
        if first.is_shard:
            plan.axis = first.axis
            plan.bounds = [n.bounds for n in nodes]
            plan.mode = "stitched" if all(n.kind == "all_reduce" for n in nodes) else "shards"
        for i, unit in enumerate(units):
            n = unit.node
            local = n.kind == "all_reduce" or n.owner == self.rank
            if plan.mode == "shards":
                if local:
                    start, stop = n.bounds
                    initial = slice_value(tf.convert_to_tensor(variable), plan.axis, start, stop)
                    unit.target = make_variable(initial, f"{_safe(n.name)}_shard")
            elif local and (plan.mode == "whole" or i == 0):
                unit.target = variable  # "stitched": the first unit stands for the variable
            if n.kind == "all_reduce":
                residual = None
                if n.error_feedback:
                    residual = make_variable(tf.zeros(n.shape, variable.dtype), f"{_safe(n.name)}_residual")
                unit.compressor = Compressor(n.wire_dtype, residual, name=n.name)
        return plan

    def replicable_units(self) -> list[tuple[int, int, _Unit]]:
        """(variable index, unit index, unit) of every parameter-server unit (synchronous, stale or
        asynchronous): the ones whose optimizer slots live on their owner alone."""
        return [(vi, ui, u) for vi, p in enumerate(self._plans) for ui, u in enumerate(p.units)
                if u.node.kind == "ps"]  # fmt: skip

    def keep_slot_replicas(
        self,
        slots_of: dict[int, list[Any]],
        layout: Callable[[int, Any], list[tuple[tuple[int, ...], str] | None]],
        initial: Callable[[int, Any], list[np.ndarray | None]] | None,
    ) -> None:
        """From now on every step publishes each PS unit's optimizer slots from its owner, and every other rank
        keeps them in replica variables (:attr:`slot_replicas`).

        A parameter server's slots (momentum, Adam's moments) exist on its
        owner only; with replicas a crashed owner's slots survive on every
        other rank as they were after the last step, and the slot gather of
        the membership change takes them from there
        (kungfu_tf/optimizers/strategy_replan.py). They travel in the same
        broadcast as the unit's new value (:meth:`_publish_unit`): as many
        bytes again as the value for SGD with momentum, twice for Adam. A
        sparse variable's slots go whole, in broadcasts of their own (the
        rows a step touched are not tracked). A stale or asynchronous unit's
        owner saves its slots with its value, in the same blob where their
        dtype is the value's, and the others fetch them as they fetch the
        value (:meth:`_publish_stale_unit`): a replica is as old as that
        rank's copy of the value, at most K steps.

        ``slots_of``: id(target) -> its slots by kind (None: no slot of that
        kind), for the units this rank owns; ``layout(vi, node)``: the unit's
        slots' (shape, dtype name) by kind, the same on every rank (None: no
        slot of that kind: Muon's matrices have one kind fewer);
        ``initial(vi, node)``: the replica's starting values by kind (the
        slots the plan starts with); None: the owners' slots as they are now
        (a fresh optimizer's, which are not all zeros: Adagrad's and Ftrl's
        accumulators start at 0.1), one broadcast per unit, run now on every
        rank (collective).
        """
        self._keeps_slots = True
        self._slots_of = dict(slots_of)
        self.slot_replicas = {}
        with tf.init_scope():
            for vi, ui, unit in self.replicable_units():
                owner = unit.node.owner == self.rank
                shapes = layout(vi, unit.node)
                if initial is not None:
                    values = None if owner else initial(vi, unit.node)
                else:
                    mine = self._slots_of[id(unit.target)] if owner else [
                        None if s is None else tf.zeros(s[0], s[1]) for s in shapes]  # fmt: skip
                    present = [tf.convert_to_tensor(v) for v in mine if v is not None]
                    got = iter(ps_sync.publish_together(present, unit.node.owner,
                                                        f"{self.name}/slot_replicas/v{vi}/s{ui}"))  # fmt: skip
                    values = [None if s is None else next(got) for s in shapes]
                if owner:
                    continue
                assert values is not None
                self.slot_replicas[(vi, ui)] = [
                    None if value is None else
                    tf.Variable(value, trainable=False, name=f"{_safe(unit.node.name)}_slot{k}_replica")
                    for k, value in enumerate(values)
                ]  # fmt: skip

    def _publish_slots(
        self, prefix: str, after: list[Any], present: set[int], sent: set[tuple[int, int]]
    ) -> tuple[list[Any], list[Any]]:
        """The owners' slots to every rank after the update: (collective outputs to keep alive, replica writes).

        Only those that did not travel with their unit's value (``sent``,
        see :meth:`_publish_unit`): a sparse unit's, whose value goes by
        rows while its slots go whole. A variable without a gradient this
        step (``present``) was not updated, nor its slots.
        """
        alive: list[Any] = []
        writes: list[Any] = []
        if not self._keeps_slots:
            return alive, writes
        with tf.control_dependencies(after):
            for vi, ui, unit in self.replicable_units():
                if vi not in present or (vi, ui) in sent:
                    continue
                owner = unit.node.owner == self.rank
                held = self._slots_of[id(unit.target)] if owner else self.slot_replicas[(vi, ui)]
                for k, slot in enumerate(held):
                    if slot is None:
                        continue
                    got = ps_sync.publish_value(tf.convert_to_tensor(slot), unit.node.owner,
                                                f"{prefix}/v{vi}/s{ui}/slot{k}")  # fmt: skip
                    alive.append(got)
                    if not owner:
                        writes.append(slot.assign(got))
        return alive, writes

    def _check_identical_eagerly(self) -> bool:
        """Consensus on the strategy's bytes now, if we can run ops eagerly; False otherwise."""
        with tf.init_scope():
            if not tf.executing_eagerly():
                return False
            agreed = bool(self._consensus())
        if not agreed:
            raise StrategyError(self._mismatch_message())
        return True

    def verify_identical(self) -> None:
        """Consensus on the strategy's bytes now (eagerly): ``StrategyError`` if the workers hold different ones."""
        if not self._check_identical_eagerly():
            raise StrategyError("verify_identical() runs eagerly, outside any tf.function or v1 graph")

    def _consensus(self) -> tf.Tensor:
        data = np.frombuffer(canonical_bytes(self.strategy) or b"\0", dtype=np.uint8)
        return ops.consensus(tf.constant(data), name=call_prefix(f"{self.name}/strategy_consensus"))

    def _mismatch_message(self) -> str:
        first = self.strategy.node_config[0].var_name if self.strategy.node_config else "none"
        return (
            f"the workers do not hold identical strategies (rank {self.rank}: id {self.strategy.id!r}, "
            f"{len(self.strategy.node_config)} nodes, first variable {first!r}); give every worker the same "
            "strategy file or builder settings, and build the same models in the same order (Keras names "
            "variables by creation order)"
        )

    @property
    def targets(self) -> list[Any]:
        """The variables the wrapped optimizer updates on this rank (its slots exist only for these)."""
        return [u.target for p in self._plans for u in p.units if u.target is not None]

    def placements(self) -> list[tuple[int, ResolvedNode, Any]]:
        """(variable index, node, target or None) for every unit: who updates which part of which variable.

        A target is the model variable itself (whole, or a partitioned
        variable whose shards are all all-reduced) or a shard variable.
        """
        return [(vi, u.node, u.target) for vi, p in enumerate(self._plans) for u in p.units]

    def forget_stored(self) -> None:
        """Drops what this plan's stale parameter servers left in this worker's store (values, slots, pushed
        gradients, clocks): the plan was replaced, and no step uses its names again. Local, eager."""
        if self._has_stale:
            with tf.init_scope():  # now, not as an op of a graph being built
                p2p.forget(self._keys)

    @property
    def replicated(self) -> bool:
        """True if every rank updates every variable (no PS): optimizer state is the same everywhere."""
        return all(p.all_reduced for p in self._plans)

    @property
    def server_variables(self) -> list[str]:
        """Names of the variables (some of) whose shards a parameter server updates."""
        return [p.variable.name for p in self._plans if not p.all_reduced]

    # ------------------------------------------------------------------- step

    def step(
        self,
        grads: Sequence[Gradient],
        apply_fn: ApplyFn,
        rider: tf.Tensor | None = None,
        observe: ObserveFn | None = None,
        clip: GradientClip | None = None,
    ) -> tf.Operation | None:
        """Synchronises ``grads`` (one per variable, ``None`` allowed), applies, publishes.

        ``apply_fn(gradients, variables)`` is called once with the targets
        this rank updates (possibly none). Returns an op that completes the
        step (v1 graphs run it; in ``tf.function`` it runs anyway).

        ``rider`` (a small 1-D float tensor, e.g. monitoring scalars) is
        averaged over the workers inside the first merge group's collective;
        ``observe(averaged gradients by variable, averaged rider)`` is then
        called and its op becomes part of the step. Both need every variable
        all-reduced (:attr:`replicated`): a parameter server's averaged
        gradient exists only on its owner.

        ``clip``: the averaged gradients clipped by norm as one process would
        (kernels/gradient_clip.py) before ``apply_fn``, whose own clipping
        must then be off; for plans with parameter servers (an all-reduce
        plan's ``apply_fn`` sees every averaged gradient and clips alike).

        Raises:
            StrategyError: ``clip`` with a stale parameter server, whose
                gradients of one step never meet.
        """
        if clip is not None and self._has_stale:
            raise StrategyError(
                f"clipping gradients by norm ({clip.kind} {clip.value}) needs the norm of one step's averaged "
                "gradients, but this strategy has stale parameter servers, which apply gradients of different "
                "steps; use clipvalue, a synchronous strategy (staleness 0), or no clipping"
            )
        if len(grads) != len(self._plans):
            raise ValueError(f"got {len(grads)} gradients for {len(self._plans)} variables")
        if (rider is None) != (observe is None):
            raise ValueError("pass both rider and observe, or neither")
        if rider is not None and not self.replicated:
            raise StrategyError(
                "gradient monitoring needs the averaged gradient of every variable on every worker, but this "
                f"strategy updates {self.server_variables} on parameter servers (only their owner sees their "
                "averaged gradient); use an all-reduce strategy (e.g. 'AllReduce', 'PartitionedAR') or no monitor"
            )
        prefix = call_prefix(self._keys)
        must_run: list[Any] = []
        if self.guarded and not tf.executing_eagerly():
            # Before the first collective: a step traced for a plan that was
            # re-built since (a membership change) must not send anything.
            grads = _after_op(grads, plan_generation.check_current(repr(self.strategy.id)))
        if not self._checked_eagerly:
            must_run.append(
                tf.debugging.assert_equal(self._consensus(), True, message=self._mismatch_message())
            )
        # The step number only matters to stale PS (versions and clocks).
        t = self._step.read_value() if self._has_stale else None
        present = {vi for vi, g in enumerate(grads) if g is not None}
        sparse: set[tuple[int, int]] = set()
        synced, reduced_rider = self._synchronize(grads, prefix, must_run, sparse, rider)
        observed: list[tf.Operation] = []
        if observe is not None:
            by_variable = [synced.get((vi, 0)) for vi in range(len(self._plans))]
            observed = _as_dependency(observe(by_variable, reduced_rider))

        before_apply: list[Any] = list(must_run)
        apply_grads, apply_vars, snapshots = [], [], {}
        apply_owner: list[int] = []  # the model variable of each of apply_grads
        counted: list[bool] = []
        for vi, plan in enumerate(self._plans):
            for ui, unit in enumerate(plan.units):
                if unit.target is None or (vi, ui) not in synced:
                    continue
                g = synced[(vi, ui)]
                if plan.mode == "shards":
                    start, stop = unit.node.bounds
                    before_apply.append(
                        unit.target.assign(slice_value(tf.convert_to_tensor(plan.variable), plan.axis, start, stop))
                    )
                if (vi, ui) in sparse:
                    # The table before the update, to find the rows it changes.
                    with tf.control_dependencies(before_apply):
                        snapshots[(vi, ui)] = tf.identity(tf.convert_to_tensor(unit.target))
                apply_grads.append(g)
                apply_vars.append(unit.target)
                apply_owner.append(vi)
                # Each variable's norm counted once over the workers: an all-reduced unit is everywhere.
                counted.append(unit.node.kind == "ps" or self.rank == 0)
        partial_norms = None
        if clip is not None and not self.replicated:
            counted_grads = [g for g, c in zip(apply_grads, counted) if c]
            partial_norms = clip.squared_norms(counted_grads, [vi for vi, c in zip(apply_owner, counted) if c],
                                               len(self._plans))  # fmt: skip
        completed, total_norms = self._completed_everywhere(synced, must_run, prefix, partial_norms)
        if partial_norms is not None:
            assert clip is not None
            apply_grads = clip.apply(apply_grads, apply_owner, total_norms)
        with tf.control_dependencies(before_apply + list(snapshots.values()) + completed):
            applied = apply_fn(apply_grads, apply_vars)
        after = _as_dependency(applied)
        sent_slots: dict[tuple[int, int], list[Any]] = {}  # replica writes of the slots sent with their values
        with tf.control_dependencies(after + before_apply):
            finished = self._publish(synced, snapshots, present, sparse, prefix, t, sent_slots)
        slots_alive, slot_writes = self._publish_slots(prefix, after + before_apply, present, set(sent_slots))
        slot_writes += [w for writes in sent_slots.values() for w in writes]
        # The owner's broadcasts (and other collectives) produce outputs this
        # rank does not use: keep_alive makes them run (see kungfu_tf.ops.collective).
        deps = [ops.keep_alive(finished + slots_alive + must_run), *after, *observed,
                *[d for w in slot_writes for d in _as_dependency(w)]]
        if self._has_stale:
            with tf.control_dependencies([d for d in deps if d is not None]):
                deps = [self._step.assign_add(1)]
        if tf.executing_eagerly():
            return None
        return tf.group(*[d for d in deps if d is not None])

    def _completed_everywhere(
        self, synced: dict[tuple[int, int], Any], must_run: list[Any], prefix: str, payload: tf.Tensor | None = None
    ) -> tuple[list[Any], tf.Tensor | None]:
        """What the update waits for: this step's synchronisation, completed on every rank or on none; and
        ``payload`` (a float32 vector, or None) summed over the workers in the same all-reduce.

        The update, and the optimizer's step counter with it (Keras's
        ``iterations.assign_add`` has no data edge to any gradient), must
        run on every rank or on none. A step failed by a lost peer is run
        again after the elastic sync: counted there as well, it put Adam's
        bias correction one step ahead of one process trained on the same
        batches; counted on some ranks only, the next sync refused the
        differing counters. Nor may an update start before every average of
        the step exists (tests/test_all_or_nothing_step.py).

        When every rank all-reduces every variable, its averages exist only
        if every rank's collectives completed. With parameter servers a
        rank that owns nothing holds no average, and an owner's reduce can
        complete while a sender's cannot: a 4-byte all-reduce entered
        after this rank's own part of the synchronisation completes on every
        rank or on none. Stale parameter servers are left out (their
        workers are meant to run ahead of each other); eagerly a failed
        collective raises before anything is applied. A ``payload`` rides
        in that all-reduce (the clip's squared norms: they exist once the
        synchronisation completed, and the update waits for them anyway).
        """
        if tf.executing_eagerly():
            summed = None if payload is None else ops.all_reduce(payload, name=f"{prefix}/completed")
            return [], summed
        averages = [g.values if isinstance(g, tf.IndexedSlices) else g for g in synced.values()]
        if (self.replicated or self._has_stale) and payload is None:
            return averages, None
        # Data edges into stateful keep_alive ops: Grappler turns a collective whose output feeds only
        # control edges into a NoOp (kungfu_tf/ops/collective.py), and the update would not wait at all.
        with tf.control_dependencies([ops.keep_alive(averages + must_run)]):
            sent = tf.zeros([1], tf.float32) if payload is None else payload
            agreed = ops.all_reduce(sent, name=f"{prefix}/completed")
        return [ops.keep_alive([agreed])], (None if payload is None else agreed)

    def _synchronize(
        self,
        grads: Sequence[Gradient],
        prefix: str,
        must_run: list[Any],
        sparse: set[tuple[int, int]],
        rider: tf.Tensor | None = None,
    ) -> tuple[dict[tuple[int, int], Any], tf.Tensor | None]:
        """Gradient of every unit this rank updates, averaged over the workers, and the averaged rider.

        Adds to ``sparse`` the PS units whose slices were gathered: their
        owners publish only the rows they change.
        """
        grouped = GroupedAllReduce(f"{prefix}/ar")
        synced: dict[tuple[int, int], Any] = {}
        dtypes: dict[tuple[int, int], tf.DType] = {}
        for vi, (plan, g) in enumerate(zip(self._plans, grads)):
            if g is None:
                continue
            pieces = [g] if plan.mode == "whole" else split_gradient(g, plan.axis, plan.bounds)
            for ui, (unit, piece) in enumerate(zip(plan.units, pieces)):
                key, node = (vi, ui), unit.node
                base = f"{prefix}/v{vi}/s{ui}"
                if node.kind == "all_reduce":
                    if isinstance(piece, tf.IndexedSlices):
                        synced[key] = average_indexed_slices(piece, f"{base}/sparse")
                    else:
                        piece = tf.convert_to_tensor(piece)
                        dtypes[key] = piece.dtype
                        compressor = unit.compressor
                        grouped.add(key, compressor.encode(piece), node.group, node.topology, compressor.reduce_op)
                    continue
                owner = node.owner == self.rank
                if unit.stale:
                    if _rows_of(piece, plan):
                        shape, dtype = unit.node.shape, tf.as_dtype(plan.variable.dtype)
                        pushed = ps_stale.push_rows(piece, node.owner, f"{base}/grad", shape[0])
                        sparse.add(key)
                        if owner:
                            with tf.control_dependencies([pushed] if pushed is not None else []):
                                synced[key] = ps_stale.take_mean_rows(f"{base}/grad", shape, dtype, self.size)
                        elif pushed is not None:
                            must_run.append(pushed)
                        continue
                    dense = tf.convert_to_tensor(piece)
                    pushed = ps_stale.push_gradient(dense, node.owner, f"{base}/grad")
                    if owner:
                        with tf.control_dependencies([pushed] if pushed is not None else []):
                            synced[key] = ps_stale.take_mean(f"{base}/grad", dense, self.size)
                    elif pushed is not None:
                        must_run.append(pushed)
                    continue
                if _rows_of(piece, plan):
                    avg = average_indexed_slices(piece, f"{base}/sparse")
                    sparse.add(key)
                    if owner:
                        synced[key] = avg
                    else:
                        must_run.extend([avg.values, avg.indices])
                    continue
                reduced = ps_sync.reduce_to_owner(tf.convert_to_tensor(piece), node.owner, f"{base}/reduce")
                if owner:
                    synced[key] = reduced
                else:
                    must_run.append(reduced)
        host = next(iter(dtypes), None)  # the first dense all-reduced unit
        rider_key, reduced_rider = ("rider",), None
        if rider is not None:
            if host is None:
                # No dense gradient to ride with: a collective of its own.
                reduced_rider = ops.all_reduce(tf.cast(rider, tf.float64), op="mean", name=f"{prefix}/rider")
            else:
                unit = self._plans[host[0]].units[host[1]]
                node, compressor = unit.node, unit.compressor
                # In the host's (group, mean) collective when its wire dtype is
                # float32/float64; else float32 in the same group (one more
                # collective, concurrent with the group's).
                wire = tf.as_dtype(dtypes[host]) if compressor.reduce_op == "mean" else tf.float32
                wire = wire if wire in (tf.float32, tf.float64) else tf.float32
                grouped.add(rider_key, tf.cast(rider, wire), node.group, node.topology, "mean")
        reduced = grouped.run()
        if rider_key in reduced:
            reduced_rider = reduced.pop(rider_key)  # float32 or float64, as it travelled
        for key, avg in reduced.items():
            synced[key] = self._plans[key[0]].units[key[1]].compressor.decode(avg, dtypes[key])
        for vi, plan in enumerate(self._plans):
            if plan.mode == "stitched" and (vi, 0) in synced:
                synced[(vi, 0)] = _stitch_gradient([synced.pop((vi, ui)) for ui in range(len(plan.units))], plan)
        return synced, reduced_rider

    def _publish(
        self,
        synced: dict[tuple[int, int], Any],
        snapshots: dict[tuple[int, int], tf.Tensor],
        present: set[int],
        sparse: set[tuple[int, int]],
        prefix: str,
        t: tf.Tensor | None,
        sent_slots: dict[tuple[int, int], list[Any]],
    ) -> list[Any]:
        """Brings every rank's variables up to date after the owners' updates; returns the ops.

        ``sent_slots`` gets, for each unit whose slot replicas travelled with
        its value, the replicas' writes (none on the owner)."""
        done: list[Any] = []
        for vi, plan in enumerate(self._plans):
            # All-reduced variables are already up to date; a variable whose
            # gradient is None (on every worker alike) did not change.
            if plan.mode == "stitched" or plan.all_reduced or vi not in present:
                continue
            bundled: list[tuple[Any, tf.Tensor]] = []  # (slot replica, its value fetched with the unit's value)
            updates = [
                self._publish_unit(
                    plan, vi, ui, unit, snapshots, (vi, ui) in sparse, prefix, t, sent_slots, done, bundled
                )
                for ui, unit in enumerate(plan.units)
            ]
            written = self._write_back(plan, updates)
            done.extend(written)
            # After the value they came with: a step aborted in between (another fetch failing) leaves the
            # replicas at most one version behind the value, never ahead of it.
            with tf.control_dependencies([d for w in written for d in _as_dependency(w)]):
                done.extend(replica.assign(tf.reshape(value, replica.shape)) for replica, value in bundled)
            # Every output of every collective above, even those this rank
            # does not need, goes to ops.keep_alive (see there): Grappler would
            # otherwise turn an unused collective into a NoOp and the peers
            # would wait for it forever.
            for _, payload in updates:
                done.extend(payload if isinstance(payload, tuple) else [payload])
        if self._has_stale:
            done.extend(self._clock(prefix, t, done))
        return done

    def _publish_unit(
        self,
        plan: _VariablePlan,
        vi: int,
        ui: int,
        unit: _Unit,
        snapshots: dict[tuple[int, int], tf.Tensor],
        sparse: bool,
        prefix: str,
        t: tf.Tensor | None,
        sent_slots: dict[tuple[int, int], list[Any]],
        alive: list[Any],
        bundled: list[tuple[Any, tf.Tensor]],
    ) -> tuple[str, Any]:
        """("full", value) | ("rows", (indices, values, a tensor to depend on)) for one unit; ``bundled`` gets the
        slot replicas a stale unit's value blob brought, with their values (written after the value)."""
        node = unit.node
        base = f"{prefix}/v{vi}/s{ui}"
        source = unit.target if unit.target is not None else plan.variable
        if node.kind == "all_reduce":
            return ("full", tf.convert_to_tensor(unit.target))
        owner = node.owner == self.rank
        if plan.mode == "whole":
            like = plan.variable
        else:
            start, stop = node.bounds
            like = slice_value(tf.convert_to_tensor(plan.variable), plan.axis, start, stop)
        if unit.stale:
            return self._publish_stale_unit(plan, vi, ui, unit, source, like, snapshots, sparse, base, t, sent_slots,
                                            bundled)  # fmt: skip
        if sparse:
            rows, values, count = ps_sync.publish_rows(
                owner, snapshots.get((vi, ui)), source, node.owner, f"{base}/rows"
            )
            return ("rows", (rows, values, count))
        value = tf.convert_to_tensor(source) if owner else tf.convert_to_tensor(like)
        if not self._keeps_slots:
            return ("full", ps_sync.publish_value(value, node.owner, f"{base}/value"))
        # The slot replicas (keep_slot_replicas) travel with the value: one broadcast instead of 1 + kinds, and
        # an owner lost in it leaves value and slots as they were together, or neither.
        held = [s for s in (self._slots_of[id(unit.target)] if owner else self.slot_replicas[(vi, ui)]) if s is not None]
        got = ps_sync.publish_together([value, *[tf.convert_to_tensor(s) for s in held]], node.owner,
                                       f"{base}/value_and_slots")  # fmt: skip
        sent_slots[(vi, ui)] = [] if owner else [r.assign(s) for r, s in zip(held, got[1:])]
        alive.extend(got[1:])  # slots of another dtype than the value's travel in a broadcast of their own
        return ("full", got[0])

    def _publish_stale_unit(
        self,
        plan: _VariablePlan,
        vi: int,
        ui: int,
        unit: _Unit,
        source: Any,
        like: Any,
        snapshots: dict[tuple[int, int], tf.Tensor],
        sparse: bool,
        base: str,
        t: tf.Tensor,
        sent_slots: dict[tuple[int, int], list[Any]],
        bundled: list[tuple[Any, tf.Tensor]],
    ) -> tuple[str, Any]:
        """:meth:`_publish_unit` for a stale or asynchronous unit: the owner saves, the others fetch; nobody waits
        for a collective.

        With slot replicas (:meth:`keep_slot_replicas`) a dense unit's slots of
        its value's dtype travel in its value's blob: every fetch then gets a
        value and the slots of the same version (the replicas are written
        after the value: a step aborted in between leaves them one version
        behind it), and a crashed owner's value and slots come from the first
        member's copy and replicas. A sparse unit's slots (its value goes by rows) and slots of
        another dtype go in blobs of their own, fetched under the same bound
        (:meth:`_stale_slots`): a version at most a few steps apart.
        """
        node = unit.node
        owner = node.owner == self.rank
        blob = f"{base}/value"
        min_version = t + 1 - node.staleness if node.sync else tf.constant(1, tf.int64)
        held: list[Any] = []
        if self._keeps_slots:
            held = [s for s in (self._slots_of[id(unit.target)] if owner else self.slot_replicas[(vi, ui)])
                    if s is not None]  # fmt: skip
        dtype = tf.as_dtype(plan.variable.dtype)
        together = [] if sparse else [s for s in held if tf.as_dtype(s.dtype) == dtype]
        if self._keeps_slots:
            in_value_blob = {id(s) for s in together}
            sent_slots[(vi, ui)] = self._stale_slots(
                [s for s in held if id(s) not in in_value_blob], node.owner, owner, base, t, min_version
            )
        if owner and sparse:
            return ("rows", ps_stale.save_changed_rows(blob, snapshots[(vi, ui)], source, t + 1))
        if owner:
            value = tf.convert_to_tensor(source)
            saved = ps_stale.save_value(_flat_concat([value, *together]) if together else value, blob, t + 1)
            with tf.control_dependencies([saved] if saved is not None else []):
                return ("full", tf.convert_to_tensor(source))
        if sparse:
            return ("rows", ps_stale.fetch_rows(node.owner, blob, min_version, node.shape, dtype))
        like = tf.convert_to_tensor(like)
        if not together:
            return ("full", ps_stale.fetch_value(node.owner, blob, min_version, like))
        parts = [like, *together]
        sizes = [int(np.prod(x.shape)) for x in parts]
        got = tf.split(ps_stale.fetch_value(node.owner, blob, min_version, tf.zeros([sum(sizes)], dtype)), sizes)
        bundled.extend(zip(together, got[1:]))
        return ("full", tf.reshape(got[0], like.shape))

    def _stale_slots(
        self, slots: list[Any], owner_rank: int, owner: bool, base: str, t: tf.Tensor, min_version: tf.Tensor
    ) -> list[Any]:
        """A stale unit's slot replicas that do not travel in its value's blob: the owner's saves (one blob per
        dtype, as the version its value has), or this rank's replica writes (fetched under the value's bound)."""
        by_dtype: dict[tf.DType, list[Any]] = {}
        for slot in slots:
            by_dtype.setdefault(tf.as_dtype(slot.dtype), []).append(slot)
        out: list[Any] = []
        for dtype, group in by_dtype.items():
            blob = f"{base}/slots/{dtype.name}"
            if owner:
                saved = ps_stale.save_value(_flat_concat(group), blob, t + 1)
                out.extend([saved] if saved is not None else [])
                continue
            sizes = [int(np.prod(s.shape)) for s in group]
            got = ps_stale.fetch_value(owner_rank, blob, min_version, tf.zeros([sum(sizes)], dtype))
            out.extend(s.assign(tf.reshape(g, s.shape)) for s, g in zip(group, tf.split(got, sizes)))
        return out

    def _write_back(self, plan: _VariablePlan, updates: list[tuple[str, Any]]) -> list[Any]:
        var = plan.variable
        if plan.mode == "whole":
            kind, payload = updates[0]
            owner = plan.units[0].node.owner == self.rank
            if owner:
                # Nothing to write: the owner updated the variable itself.
                # Its broadcasts' outputs are returned to be consumed.
                return list(payload) if kind == "rows" else [payload]
            if kind == "rows":
                rows, values, _ = payload
                return [_tf_variable(var).scatter_update(tf.IndexedSlices(values, rows))]
            return [var.assign(payload)]
        if all(kind == "full" for kind, _ in updates):
            return [var.assign(stitch([p for _, p in updates], plan.axis))]
        # Axis 0 with some row updates: scatter every shard's new rows.
        indices, values, counts = [], [], []
        for (kind, payload), (start, stop) in zip(updates, plan.bounds):
            if kind == "rows":
                rows, vals, count = payload
                counts.append(count)  # the owner's count broadcast must run too
                indices.append(rows + start)
                values.append(vals)
            else:
                indices.append(tf.range(start, stop, dtype=tf.int32))
                values.append(payload)
        update = _tf_variable(var).scatter_update(tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0)))
        return [update, *counts]

    def _clock(self, prefix: str, t: tf.Tensor, done: list[Any]) -> list[Any]:
        """Publishes this worker's clock and waits for the slowest within the smallest staleness."""
        with tf.control_dependencies(done):
            saved = ps_stale.save_clock(prefix, t + 1)
        if not self._stale_k:
            return [saved] if saved is not None else []
        k = min(self._stale_k)
        with tf.control_dependencies([saved] if saved is not None else []):
            waited = ps_stale.wait_for_clocks(prefix, self.rank, self.size, t + 1 - k)
        return waited


def _flat_concat(tensors: Sequence[Any]) -> tf.Tensor:
    """``tensors`` (variables too) flattened and concatenated, in order."""
    return tf.concat([tf.reshape(tf.convert_to_tensor(x), [-1]) for x in tensors], 0)


def _safe(name: str) -> str:
    return name.replace("/", "_").replace(":", "_")


def _as_dependency(x: Any) -> list[tf.Operation]:
    """``x`` as control dependencies: an op, a tensor, or a variable-like result (``assign_add``)."""
    if x is None or tf.executing_eagerly():
        return []
    if isinstance(x, tf.Operation):
        return [x]
    op = getattr(x, "op", None)
    return [op] if isinstance(op, tf.Operation) else []


def _after_op(grads: Sequence[Gradient], op: tf.Operation) -> list[Gradient]:
    """``grads`` (None kept) as tensors that exist only after ``op`` ran."""
    out: list[Gradient] = []
    with tf.control_dependencies([op]):
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(tf.identity(g.values), tf.identity(g.indices), g.dense_shape))
            else:
                out.append(None if g is None else tf.identity(g))
    return out


def _rows_of(piece: Any, plan: _VariablePlan) -> bool:
    """True if ``piece`` travels as rows: sparse, and not a shard cut across its rows (axis > 0)."""
    return isinstance(piece, tf.IndexedSlices) and not (plan.mode == "shards" and plan.axis != 0)


def _stitch_gradient(pieces: list[Any], plan: _VariablePlan) -> Any:
    """The whole gradient from its all-reduced shards (dense, or sparse with shard offsets undone)."""
    if not any(isinstance(p, tf.IndexedSlices) for p in pieces):
        return stitch([tf.convert_to_tensor(p) for p in pieces], plan.axis)
    if plan.axis == 0:
        indices = [p.indices + tf.cast(start, p.indices.dtype) for p, (start, _) in zip(pieces, plan.bounds)]
        values = [p.values for p in pieces]
        shape = tf.convert_to_tensor(plan.variable.shape.as_list(), tf.int64)
        return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0), shape)
    return stitch([tf.convert_to_tensor(p) for p in pieces], plan.axis)
