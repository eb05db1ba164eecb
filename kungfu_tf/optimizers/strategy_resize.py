"""Re-building a strategy-driven optimizer for a new cluster at every membership change.

A strategy is a function of (variables, cluster). When the cluster changes
(a resize, a joiner admitted, a crashed worker dropped), every worker of the
new cluster, joiners included, runs :func:`rebuild_for_cluster` as an apply
listener (before the elastic state syncs):

1. the strategy for the new cluster: the members' first worker tells every
   worker the source in force (kungfu_tf/strategy/source_record.py): a
   joiner runs the script from its start, but the members may have switched
   to another strategy since (``switch_strategy``, a ``StrategyPolicy``), and
   the joiner adopts theirs. A builder is re-run on the new cluster; a
   written strategy (a proto or a file) has its owners re-mapped
   (kungfu_tf/strategy/remap.py) by the members and sent to the joiners;
2. the optimizer slots the old owners held are gathered on every worker
   (kungfu_tf/optimizers/strategy_replan.py, the code path a strategy switch
   shares; for a shrink, before it commits, while the leaving owners are
   still members: :func:`prepare_shrink`). The slots of an owner that
   crashed come from the replicas every rank keeps in an elastic job
   (``strategy_replan.keep_slot_replicas``; a stale parameter server's are
   as old as the first member's copy of the value); without them
   (``KUNGFU_SLOT_REPLICAS=0``) they restart (at zero, or as a fresh
   optimizer's), and a warning names them. A stale parameter
   server's copies, which differ between workers, become the owners' values
   first (kungfu_tf/optimizers/stale_copies.py; a crashed owner's: the first
   member's copy);
3. a new plan (its consensus checks that every worker holds the same
   strategy bytes, as at the start), the optimizer rebuilt on its targets,
   and each new target's slots cut from the gathered ones
   (``strategy_replan.install_plan``); an all-reduce
   plan the change left as it was is kept instead (its collectives read the
   cluster at run time), with the traced step;
4. the plan generation advances (not when the plan was kept): steps traced for the old plan refuse to run
   (kungfu_tf/strategy/plan_generation.py), ``kungfu_tf.elastic.function``
   re-traces.

Example (what the wrapped optimizer registers in an elastic job)::

    em.add_apply_listener(lambda change: rebuild_for_cluster(opt, change), first=True)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective
from kungfu_tf.ops import elastic_membership as em
from kungfu_tf.optimizers.stale_copies import refresh_stale_copies
from kungfu_tf.optimizers.strategy_replan import gather_slots, install_plan
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.compiler import StrategyPlan
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.remap import check_replicas, remap_owners
from kungfu_tf.strategy.source import StrategySource, resolve_strategy
from kungfu_tf.strategy.source_record import source_from_record, source_record
from kungfu_tf.strategy.variable_info import describe_variables

log = logging.getLogger("kungfu_tf.strategy")


def is_builder(source: StrategySource) -> bool:
    """True if ``source`` is re-run for every cluster (a builder or a builder's name), not a written strategy."""
    from kungfu_tf.strategy.builders import BUILDERS

    return isinstance(source, StrategyBuilder) or (isinstance(source, str) and source in BUILDERS)


def _all_members(joined: bool, prefix: str) -> list[int]:
    """Ranks (in the new cluster) of the workers that were members before this change (not joiners)."""
    mine = tf.constant([0 if joined else 1], tf.int32)
    flags = collective.all_gather(mine, name=f"{prefix}/members").numpy().reshape(-1)
    return [r for r, f in enumerate(flags) if f]


def _broadcast_bytes(data: bytes, root: int, name: str) -> bytes:
    """``data`` of rank ``root``, on every worker (collective)."""
    length = collective.broadcast(tf.constant(len(data), tf.int64), root=root, name=f"{name}/length")
    if int(length) == 0:
        return b""
    payload = np.frombuffer(data, np.uint8) if data else np.zeros(int(length), np.uint8)
    return collective.broadcast(tf.constant(payload), root=root, name=name).numpy().tobytes()


def _source_in_force(opt: Any, joined: bool, first_member: int, prefix: str) -> StrategySource | None:
    """The members' strategy source, adopted by the joiners; None: a written strategy (the members re-map theirs).

    Collective. A builder the first member cannot describe (``opaque``)
    leaves every worker its own source, as a joiner had before the record.

    Raises:
        StrategyError: on every worker alike, when a joiner cannot make the
            members' builder again (its class is not importable there).
    """
    mine = json.dumps(source_record(opt._kungfu_strategy)).encode("utf-8") if _rank() == first_member else b""
    record = json.loads(_broadcast_bytes(mine, first_member, f"{prefix}/source").decode("utf-8"))
    if "written" in record:
        return None
    if "auto" in record:
        return _adopt_auto_result(opt, record["auto"], joined, prefix)
    if "opaque" in record:
        if joined:
            log.warning("kungfu strategy: the members' strategy builder cannot be described (%s): this joiner "
                        "re-builds its own", record["opaque"])  # fmt: skip
        return opt._kungfu_strategy
    source, error = opt._kungfu_strategy, ""
    if joined:
        try:
            source = source_from_record(record)
        except StrategyError as e:
            error = str(e)
    failed = collective.all_reduce(
        tf.constant(int(bool(error)), tf.int32), op="max", name=f"{prefix}/source/failed", topology="STAR"
    )
    if int(failed):
        raise StrategyError(error or f"a joiner could not make the members' strategy builder {record['builder']} again "
                            "(see its error): it is refused")  # fmt: skip
    return source


def _adopt_auto_result(opt: Any, record: dict[str, Any], joined: bool, prefix: str) -> StrategySource:
    """The members' ``builders.Auto``: a joiner's own ``Auto`` takes their search results (collective).

    Raises:
        StrategyError: on every worker alike, when a joiner does not run
            ``builders.Auto`` with the members' settings (its script
            differs: it would search, or not, where they do not) or cannot
            read the results.
    """
    from kungfu_tf.strategy.auto.builder import Auto

    source, error = opt._kungfu_strategy, ""
    if joined:
        if not isinstance(source, Auto):
            error = (f"the members search with builders.Auto and this joiner runs {type(source).__name__}: the "
                     "joiner's script must make the same optimizer")  # fmt: skip
        elif source.search_settings() != record.get("settings"):
            error = (f"the members' builders.Auto has the settings {record.get('settings')} and this joiner's "
                     f"{source.search_settings()}: the joiner's script must make the same Auto")  # fmt: skip
        else:
            try:
                source.adopt_results(record.get("results", []))
            except StrategyError as e:
                error = str(e)
    failed = collective.all_reduce(
        tf.constant(int(bool(error)), tf.int32), op="max", name=f"{prefix}/source/failed", topology="STAR"
    )
    if int(failed):
        raise StrategyError(error or "a joiner could not take the members' Auto search results (see its error)")
    return source


def _strategy_for(
    source: StrategySource | None, old: StrategyPlan, change: em.Change, joined: bool, first_member: int,
    variables: list[Any], prefix: str,
) -> strategy_pb2.Strategy:  # fmt: skip
    if source is not None:
        return resolve_strategy(source, describe_variables(variables), ClusterSpec.of_peers(change.new_peers))
    # A written strategy: the members re-map the one they ran (the joiners' warm-up
    # plan was made alone) and the first member sends it to everyone.
    data, error = b"", ""
    if not joined:
        try:
            data = canonical_bytes(remap_owners(old.strategy, change.old_peers, change.new_peers))
        except StrategyError as e:
            error = str(e)
    got = _broadcast_bytes(data, first_member, f"{prefix}/strategy")
    if not got:
        raise StrategyError(error or f"the strategy was refused for the new cluster (see the error of rank {first_member})")
    return strategy_pb2.Strategy.FromString(got)


def _nodes_bytes(strategy: strategy_pb2.Strategy) -> bytes:
    """The strategy's bytes without ``graph_config`` (builders write the cluster size there)."""
    nodes = strategy_pb2.Strategy()
    nodes.CopyFrom(strategy)
    nodes.ClearField("graph_config")
    return canonical_bytes(nodes)


def _lost_owners(change: em.Change) -> frozenset[int]:
    """Ranks of the old cluster that the new one lacks."""
    return frozenset(r for r, peer in enumerate(change.old_peers) if peer not in set(change.new_peers))


def _lost_slots(old: StrategyPlan, change: em.Change, variables: list[Any]) -> list[str]:
    """Names of the variables (or shards) whose owner left without handing over its slots, and of which no
    replica was kept (``KUNGFU_SLOT_REPLICAS=0``)."""
    lost = _lost_owners(change)
    kept = {unit.node.name for _, _, unit in old.replicable_units()} if old.slot_replicas else set()
    names = []
    for vi, node, _ in old.placements():
        if node.kind == "ps" and node.owner in lost and node.name not in kept:
            names.append(node.name if node.is_shard else getattr(variables[vi], "path", variables[vi].name))
    return names


def prepare_shrink(opt: Any, old_peers: Sequence[str], new_peers: Sequence[str], version: int) -> None:
    """Before a shrink commits (every member, the leaving ones too): the slots are gathered on the old cluster.

    The leaving owners take their optimizer slots with them otherwise. A
    written strategy that cannot be re-mapped for ``new_peers`` is refused
    here, so that the shrink changes nothing.
    """
    old: StrategyPlan = opt._kungfu_plan
    if not is_builder(opt._kungfu_strategy):
        remap_owners(old.strategy, old_peers, new_peers)  # raises StrategyError: nothing changed
    if old.replicated:
        return  # every member holds every slot: the survivors have them all
    prefix = f"kungfu/strategy/handover/v{version}"
    refresh_stale_copies(opt, old, first=_rank() == 0, prefix=prefix)  # a leaving owner's newest values
    kinds, full = gather_slots(opt, old, contributes=True, first=_rank() == 0, prefix=prefix)
    object.__setattr__(opt, "_kungfu_handover", (version + 1, tuple(new_peers), kinds, full))


def refuse_fixed_replicas(opt: Any, new_size: int) -> None:
    """Before a growth is requested: ``StrategyError`` if the written strategy in force fits only another size.

    The shrink is refused in :func:`prepare_shrink`; without this a growth
    committed first and every worker failed after it, in the re-build.
    """
    if not is_builder(opt._kungfu_strategy):
        check_replicas(opt._kungfu_plan.strategy, new_size)


def rebuild_for_cluster(opt: Any, change: em.Change) -> None:
    """Re-builds ``opt``'s plan and slots for the cluster ``change`` made (see the module docstring)."""
    started = time.monotonic()
    old: StrategyPlan = opt._kungfu_plan
    variables = list(opt._kungfu_model_variables)
    prefix = f"kungfu/strategy/rebuild/v{change.new_version}"
    # A joiner's plan is its warm-up's, made alone (Change.joined cannot tell: a joiner's
    # old peers are the members it was told of, and itself).
    joined = bool(opt._kungfu_warm_up_plan)
    members = _all_members(joined, prefix)
    if not members:
        raise StrategyError(f"no worker of cluster v{change.new_version} held the optimizer's state before it")
    first = members[0]
    source = _source_in_force(opt, joined, first, prefix)
    strategy = _strategy_for(source, old, change, joined, first, variables, prefix)
    if joined:  # what later changes re-build: the members' builder, or the strategy they wrote, re-mapped
        object.__setattr__(opt, "_kungfu_strategy", strategy if source is None else source)
    # An all-reduce plan that the change left as it was is kept, and so is the traced step: its
    # collectives read the cluster at run time, every worker updates (and holds the slots of) every
    # variable, and the state sync brings them to joiners. Decided together (a joiner's plan was made alone).
    same = old.replicated and _nodes_bytes(strategy) == _nodes_bytes(old.strategy)
    if int(collective.all_reduce(tf.constant(int(same), tf.int32), op="min", name=f"{prefix}/same", topology="STAR")):
        old.strategy = strategy  # the same nodes; graph_config says the new size
        old.verify_identical()  # as at the start, on the new cluster
        object.__setattr__(opt, "_kungfu_warm_up_plan", False)
        object.__setattr__(opt, "_kungfu_handover", None)
        log.info("kungfu strategy: %r unchanged for cluster v%d (all-reduce): plan and traced step kept",
                 strategy.id, change.new_version)  # fmt: skip
        _search_again_if_asked(opt, change)
        return
    handover = opt.__dict__.get("_kungfu_handover")
    object.__setattr__(opt, "_kungfu_handover", None)
    if handover is not None and handover[:2] == (change.new_version, tuple(change.new_peers)):
        # A shrink: every member gathered the slots before it committed (prepare_shrink).
        kinds, full = handover[2], handover[3]
    else:
        kinds, full = gather_slots(opt, old, contributes=not joined, first=_rank() == first, prefix=prefix,
                                   lost_owners=_lost_owners(change))  # fmt: skip
    # A stale parameter server's copies differ between workers: the owners' values (a lost owner's: the first
    # member's copy), before the new plan cuts its shards from them and the state sync compares them.
    refresh_stale_copies(opt, None if joined else old, first=_rank() == first, prefix=prefix,
                         lost_owners=_lost_owners(change))  # fmt: skip
    if (kinds or old.slot_kinds) and not joined and handover is None:
        lost = _lost_slots(old, change, variables)
        if lost:
            log.warning("kungfu strategy: the owner of %s left without handing over its optimizer slots: they "
                        "restart (at zero, or as a fresh optimizer's)", ", ".join(lost))  # fmt: skip
    generation = install_plan(opt, strategy, kinds, full)
    _search_again_if_asked(opt, change)
    log.info("kungfu strategy: %r re-built for cluster v%d (%d workers, %d slot kinds moved) in %.3f s; plan "
             "generation %d", strategy.id, change.new_version, len(change.new_peers), kinds,
             time.monotonic() - started, generation)  # fmt: skip


def _search_again_if_asked(opt: Any, change: em.Change) -> None:
    """``builders.Auto(research_budget=N)`` on a cluster it has no result for: a search of N trials from the next
    step (kungfu_tf/optimizers/auto_search.py). Every worker of the new cluster decides alike: the members' results
    are agreed, a joiner took them (``_adopt_auto_result``), and the cluster is the committed one."""
    from kungfu_tf.optimizers.auto_search import start_auto_search
    from kungfu_tf.strategy.auto.builder import Auto

    session = opt.__dict__.get("_kungfu_auto_session")
    if session is not None:
        session.stop(opt)  # whatever follows: a search of the old cluster must not start or go on
    auto = opt._kungfu_strategy
    cluster = ClusterSpec.of_peers(change.new_peers)
    if not isinstance(auto, Auto) or auto.research_budget is None or cluster.replicas < 2:
        return
    if auto.result_for(cluster) is not None:
        return  # searched before: Auto.build re-built that search's best
    start_auto_search(opt, auto, budget=auto.research_budget)
    if _rank() == 0:
        log.warning("kungfu auto: cluster v%d (%d workers) has not been searched: searching it again from the next "
                    "step (research_budget=%s trials)", change.new_version, cluster.replicas,
                    auto.research_budget.trials)  # fmt: skip


def _rank() -> int:
    import kungfu_tf

    return kungfu_tf.rank()
