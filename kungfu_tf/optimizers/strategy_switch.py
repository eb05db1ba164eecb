"""``switch_strategy``: every worker moves to another synchronisation strategy between two steps.

The best strategy depends on the cluster and its links (2 workers on one
host want all-reduce; 8 across a slow link may want partitioned parameter
servers), and both change while training runs. A switch is collective:
every worker calls it with the same strategy after the same step.

1. Each worker resolves the strategy for the model's variables on the
   running cluster (a builder is run, a name looked up, a file loaded) and
   validates it. The workers agree on the outcome: if one failed, every
   worker raises a ``StrategyError`` naming each failed rank and its cause.
2. Consensus on the strategy's bytes (KungFu Alg. 1, as at the start): if
   the workers hold different strategies, every worker raises a
   ``StrategyError`` naming each rank's strategy; nothing changed anywhere.
3. The optimizer state follows (kungfu_tf/optimizers/strategy_replan.py,
   the code path a membership change takes too): every slot is gathered
   on every worker, the plan is replaced and each new target's slots are
   cut from the gathered ones, bit for bit. A PS owner's slots become every
   worker's replicas when a variable moves to all-reduce, and back;
   partitioned variables re-partition.
4. The plan generation advances: a step traced for the old plan refuses to
   run with a precise error before it sends anything. Define the step with
   ``kungfu_tf.elastic.function`` (it traces again, once per switch); in
   Keras ``fit`` pass ``model=`` (or use a ``PolicyCallback``, which does it
   for its policies), so that ``fit`` traces its step again from the next batch.

A switch to the strategy in force (the same nodes) changes nothing and keeps
the traced step. ``SwitchReport`` gives the seconds each part took; the
re-trace itself happens at the next step (docs/guide/benchmarks.md measures both).

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer, switch_strategy
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), strategy="PS")
    >>> opt.build([keras.Variable([1.0, 2.0], name="w")])
    >>> report = switch_strategy(opt, "AllReduce")
    >>> report.changed, report.old_id, report.new_id
    (True, 'PS', 'AllReduce')
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective
from kungfu_tf.optimizers.loss_scale_guard import refuse_loss_scale_with_servers
from kungfu_tf.optimizers.stale_copies import refresh_stale_copies
from kungfu_tf.optimizers.strategy_replan import gather_slots, install_plan
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import plan_generation
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.compiler import StrategyPlan
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.source import StrategySource, resolve_strategy
from kungfu_tf.strategy.validation import effective_nodes
from kungfu_tf.strategy.variable_info import describe_variables

log = logging.getLogger("kungfu_tf.strategy")

PREFIX = "kungfu/strategy/switch"  # message keys; reused: every switch's collectives complete before the next


@dataclass(frozen=True)
class SwitchReport:
    """What one :func:`switch_strategy` did, and what it cost on this worker.

    ``agree_seconds``: resolving, validating and agreeing on the strategy;
    ``gather_seconds``: gathering the optimizer slots on every worker;
    ``rebuild_seconds``: the new plan (its consensus) and the optimizer
    rebuilt with its slots. The step is traced again at its next call, not
    here. ``generation``: the plan generation after the switch.

    Example:
        >>> r = SwitchReport(True, "PS", "AllReduce", 2, 0.01, 0.02, 0.03, 1)
        >>> round(r.seconds, 2)
        0.06
    """

    changed: bool
    old_id: str
    new_id: str
    slot_kinds: int
    agree_seconds: float
    gather_seconds: float
    rebuild_seconds: float
    generation: int

    @property
    def seconds(self) -> float:
        """The whole switch on this worker (agree + gather + rebuild)."""
        return self.agree_seconds + self.gather_seconds + self.rebuild_seconds


def _check_switchable(optimizer: Any) -> StrategyPlan:
    if not isinstance(optimizer, keras.optimizers.Optimizer) or not hasattr(type(optimizer), "_kungfu_build_base"):
        raise TypeError(
            "switch_strategy switches a Keras 3 optimizer wrapped by SynchronousSGDOptimizer(opt, strategy=...), "
            f"got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
            + (" without a strategy" if getattr(optimizer, "_kungfu_wrapped", False) else "")
        )
    plan = optimizer.__dict__.get("_kungfu_plan")
    if plan is None:
        raise ValueError(
            "switch_strategy: the optimizer has not seen the model's variables yet (it is not built); switch after "
            "the first step, or start with the strategy you want"
        )
    return plan


def _resolve(optimizer: Any, source: StrategySource, plan: StrategyPlan) -> strategy_pb2.Strategy:
    """The strategy ``source`` gives for the model's variables on the running cluster, validated here."""
    import kungfu_tf

    variables = describe_variables(list(optimizer._kungfu_model_variables))
    strategy = resolve_strategy(source, variables, ClusterSpec.current())
    nodes = effective_nodes(strategy, variables, replicas=kungfu_tf.size())
    if optimizer.kungfu_monitor is not None and any(n.kind != "all_reduce" for n in nodes):
        raise StrategyError(
            f"strategy {strategy.id!r} puts variables on parameter servers, but the optimizer has a GradientMonitor, "
            "which needs the averaged gradient of every variable on every worker; switch to an all-reduce strategy"
        )
    refuse_loss_scale_with_servers(optimizer, sorted({n.var_name for n in nodes if n.kind != "all_reduce"}))
    return strategy


def _gather_text(text: str, name: str) -> list[str]:
    """Every worker's ``text``, by rank."""
    raw = text.encode("utf-8")
    longest = collective.all_reduce(tf.constant([len(raw)], tf.int64), op="max", name=f"{name}/length", topology="STAR")
    padded = np.zeros([int(longest.numpy()[0])], np.uint8)
    padded[: len(raw)] = np.frombuffer(raw, np.uint8)
    rows = collective.all_gather(tf.constant(padded), name=name).numpy().reshape(-1, padded.size)
    return [bytes(row).rstrip(b"\0").decode("utf-8", "replace") for row in rows]


def _agree(optimizer: Any, source: StrategySource, plan: StrategyPlan) -> strategy_pb2.Strategy:
    """The resolved strategy, the same on every worker; else the same ``StrategyError`` on every worker."""
    error = ""
    strategy = strategy_pb2.Strategy()
    try:
        strategy = _resolve(optimizer, source, plan)
    except Exception as e:  # noqa: BLE001 -- every worker must learn of it, or the others wait for this one
        error = f"{type(e).__name__}: {e}"
    failed = collective.all_reduce(
        tf.constant([int(bool(error))], tf.int32), op="max", name=f"{PREFIX}/failed", topology="STAR"
    )
    if int(failed.numpy()[0]):
        errors = _gather_text(error, f"{PREFIX}/errors")
        causes = "; ".join(f"rank {r}: {e}" for r, e in enumerate(errors) if e)
        raise StrategyError(f"switch_strategy refused on every worker, nothing changed: {causes}")
    data = canonical_bytes(strategy)
    agreed = collective.consensus(tf.constant(np.frombuffer(data or b"\0", np.uint8)), name=f"{PREFIX}/consensus")
    if not bool(agreed.numpy()):
        mine = f"{strategy.id!r} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:12]})"
        held = _gather_text(mine, f"{PREFIX}/held")
        raise StrategyError(
            "switch_strategy: the workers asked for different strategies, nothing changed: "
            + ", ".join(f"rank {r}: {h}" for r, h in enumerate(held))
            + "; every worker must switch to the same strategy after the same step"
        )
    return strategy


def _nodes_bytes(strategy: strategy_pb2.Strategy) -> bytes:
    """The strategy's bytes without its ``id`` and ``graph_config`` (the cluster size builders write there)."""
    nodes = strategy_pb2.Strategy()
    nodes.CopyFrom(strategy)
    nodes.ClearField("graph_config")
    nodes.ClearField("id")
    return canonical_bytes(nodes)


def switch_strategy(optimizer: Any, strategy: StrategySource, model: Any = None) -> SwitchReport:
    """Switches every worker's ``optimizer`` to ``strategy`` between two steps (see the module docstring).

    Args:
        optimizer: a built ``SynchronousSGDOptimizer(keras_opt, strategy=...)``.
        strategy: a ``Strategy`` proto, a builder (``builders.PartitionedPS()``),
            a builder's name or a strategy file, as ``SynchronousSGDOptimizer``
            takes; later membership changes re-build this one.
        model: a Keras model trained by ``fit`` with this optimizer: its
            ``train_function`` is made again (``fit`` traces the new plan at
            its next batch; it reads ``model.train_function`` at every batch).

    Returns:
        A :class:`SwitchReport`.

    Raises:
        StrategyError: on every worker alike, with nothing changed: a worker
            could not resolve or validate the strategy (an unknown builder, a
            strategy for other variables), or the workers asked for
            different strategies.
        TypeError, ValueError: ``optimizer`` is not a built strategy-driven
            Keras optimizer (every worker passes the same kind, so every
            worker raises).

    Example:
        >>> from kungfu_tf.strategy import builders
        >>> opt.kungfu_switch_strategy(builders.PartitionedPS())                 # doctest: +SKIP
        >>> switch_strategy(model.optimizer, "AllReduce", model=model)           # doctest: +SKIP
    """
    import kungfu_tf

    plan = _check_switchable(optimizer)
    started = time.monotonic()
    new = _agree(optimizer, strategy, plan)
    agreed = time.monotonic()
    old_id = plan.strategy.id
    if _nodes_bytes(new) == _nodes_bytes(plan.strategy):
        plan.strategy = new  # the same nodes: the plan and the traced step stay
        object.__setattr__(optimizer, "_kungfu_strategy", strategy)
        return SwitchReport(False, old_id, new.id, 0, agreed - started, 0.0, 0.0, plan_generation.current())
    refresh_stale_copies(optimizer, plan, first=kungfu_tf.rank() == 0, prefix=PREFIX)  # the new plan starts from them
    kinds, full = gather_slots(optimizer, plan, contributes=True, first=kungfu_tf.rank() == 0, prefix=PREFIX)
    gathered = time.monotonic()
    generation = install_plan(optimizer, new, kinds, full)
    object.__setattr__(optimizer, "_kungfu_strategy", strategy)  # what later membership changes re-build
    if model is not None:
        from kungfu_tf.keras.elastic_callback import retrace_if_replanned

        retrace_if_replanned(model)
    done = time.monotonic()
    report = SwitchReport(True, old_id, new.id, kinds, agreed - started, gathered - agreed, done - gathered,
                          generation)  # fmt: skip
    log.info("kungfu strategy: switched %r -> %r (%d slot kinds moved) in %.3f s; plan generation %d",
             report.old_id, report.new_id, kinds, report.seconds, generation)  # fmt: skip
    return report
