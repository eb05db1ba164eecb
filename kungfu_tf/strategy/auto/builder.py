"""``builders.Auto``: the strategy is searched while the model trains (AutoDist's AutoStrategy).

Passed like any builder::

    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01), strategy=builders.Auto(budget=8))

    @kungfu_tf.elastic.function          # traced again after each switch of strategy
    def train_step(x, y): ...

    model.fit(..., callbacks=[kungfu_tf.keras.AutoSearchCallback()])   # or in Keras fit

Training starts with the all-reduce strategy (what ``SynchronousSGDOptimizer``
does without a strategy). From the second step on, the first steps of
training are the search's trials (kungfu_tf/strategy/auto/search.py): each
candidate runs ``warmup`` + ``trial_steps`` of the user's own steps, then the
next one, until ``budget`` trials (or ``seconds`` of trials) are spent;
the few fastest measured then run one more trial each (``confirm_top``), and
training goes on with the one whose trials' mean is lowest. These steps train
the model as any others do: every candidate is synchronous SGD. A candidate
that fails (its step raised on any worker) is scored as infinitely slow and
the same batch runs again under the next candidate.

What drives the trials is whoever runs the steps: ``kungfu_tf.elastic.function``
hands each call of a custom loop's step to the search
(kungfu_tf/strategy/step_driver.py), ``kungfu_tf.keras.AutoSearchCallback``
each batch of Keras ``fit``. A step handed to nobody (a plain ``tf.function``,
``fit`` without the callback) is refused with a ``StrategyError`` naming
both, and a v1 optimizer refuses Auto (search with ``kungfu-strategy search``
and pass its file then): never a silent fall-back to the starting strategy.

After the search, :meth:`Auto.build` returns the best strategy for the
cluster it was found on. At a membership change (an elastic job) to a
cluster it has no result for, Auto re-builds as the all-reduce builder for
the new cluster (no owners to re-map, valid on any cluster); with
``research_budget`` it then searches again on the new cluster, from the
next step, with that many trials, and keeps each cluster's result, so a
job that returns to a cluster of a shape it searched (as many workers,
spread over hosts the same way) builds that search's best without
searching again. Without it, re-scoring for the new cluster is
StrategyPolicy's job. A joiner takes the members' results with the
membership change (kungfu_tf/strategy/source_record.py), so it builds what
they build.

Example:
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> auto = Auto(budget=4, trial_steps=3)
    >>> s = auto.build([VariableInfo("w", (4,)), VariableInfo("b", (1,))], ClusterSpec(2))
    >>> s.id, [n.WhichOneof("synchronizer") for n in s.node_config]
    ('AllReduce', ['all_reduce', 'all_reduce'])
    >>> Auto(budget=0)
    Traceback (most recent call last):
    ...
    kungfu_tf.strategy.errors.StrategyError: the search budget must allow at least one trial, got trials=0
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.search import (
    SearchBudget,
    SearchModel,
    SearchRecord,
    check_confirm_top,
    check_round_sizes,
    no_trainable_variables_error,
)
from kungfu_tf.strategy.builders.all_reduce import AllReduce
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.variable_info import VariableInfo

SearchModelFactory = Callable[[Sequence[VariableInfo], ClusterSpec], SearchModel]


@dataclass
class AutoResult:
    """A finished search: the best strategy, the cluster it was measured on, every trial's record."""

    best: strategy_pb2.Strategy
    cluster: ClusterSpec
    best_seconds: float
    records: list[SearchRecord] = field(default_factory=list)
    search_seconds: float = 0.0


class Auto(StrategyBuilder):
    """Searches for the fastest strategy during the first steps of training (module docstring).

    Args:
        budget: number of trials (>= 1); None: only ``seconds`` limits the search.
        seconds: seconds of trials (all trials' wall time, agreed by the workers); None: no limit.
        trial_steps: timed steps per trial (>= 1).
        warmup: steps per trial before the timed ones (>= 0); they absorb the switch's re-trace.
        probe_wait_steps: at most this many more untimed steps per trial while
            the runtime's AUTO topology still probes the candidate's new
            collectives (kungfu_tf/strategy/auto/trials.py); 0: time right
            after the warm-up.
        confirm_top: after the budget, this many of the fastest strategies run
            one more trial each (beyond the budget) and the lowest mean wins
            (kungfu_tf/strategy/auto/search.py); 0: the fastest single trial wins.
        candidates_per_round: N of Algorithm 1 (sampled candidates per round).
        trials_per_round: K of Algorithm 1 (trials between two refinements of the ranker).
        seed: the sampler's seed (the same on every worker).
        log_path: JSON lines search log (rank 0), one line per trial; None: no log.
        show_progress: rank 0 prints one line per trial.
        search_model: ``(variables, cluster) -> SearchModel``, called at the
            search's start on every worker (collective); None: the sampler, cost
            model and ranker of ``kungfu_tf.strategy.auto``
            (:class:`~kungfu_tf.strategy.auto.search_model.AutoDistModel`).
        extra_candidates: strategies tried first, before the sampled ones.
        cluster: the cluster the search model ranks candidates for, with
            declared rates (``ClusterSpec.bandwidth_gbps`` between its hosts)
            instead of calibrated ones; None (default): the running job's,
            calibrated. The trials always run on the running job.
        research_budget: after a membership change to a cluster without a
            result, search again on it with this many trials (>= 2: the
            first measures the all-reduce strategy the change re-built);
            None (default): train on the all-reduce strategy there. Not with
            ``cluster`` (a declared cluster of one size).

    Example:
        >>> Auto(budget=8).budget.trials, Auto(budget=None, seconds=60).budget.seconds
        (8, 60)
    """

    name = "Auto"

    def __init__(
        self,
        budget: int | None = 8,
        seconds: float | None = None,
        trial_steps: int = 5,
        warmup: int = 2,
        probe_wait_steps: int = 10,
        confirm_top: int = 2,
        candidates_per_round: int = 32,
        trials_per_round: int = 4,
        seed: int = 0,
        log_path: str | os.PathLike[str] | None = None,
        show_progress: bool = True,
        search_model: SearchModelFactory | None = None,
        extra_candidates: Sequence[strategy_pb2.Strategy] = (),
        cluster: ClusterSpec | None = None,
        research_budget: int | None = None,
    ) -> None:
        self.budget = SearchBudget(budget, seconds)
        self.research_budget = None if research_budget is None else SearchBudget(research_budget, None)
        if research_budget is not None and research_budget < 2:
            raise StrategyError(
                f"research_budget must allow at least 2 trials (the first measures the all-reduce strategy a "
                f"change re-builds), got {research_budget!r}"
            )
        if research_budget is not None and cluster is not None:
            raise StrategyError(
                "research_budget searches each new cluster of an elastic job; cluster= declares one cluster of "
                f"{cluster.replicas} workers instead: pass one or the other"
            )
        if isinstance(trial_steps, bool) or not isinstance(trial_steps, int) or trial_steps < 1:
            raise StrategyError(f"trial_steps must be an int >= 1, got {trial_steps!r}")
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise StrategyError(f"warmup must be an int >= 0, got {warmup!r}")
        if isinstance(probe_wait_steps, bool) or not isinstance(probe_wait_steps, int) or probe_wait_steps < 0:
            raise StrategyError(f"probe_wait_steps must be an int >= 0, got {probe_wait_steps!r}")
        check_round_sizes(candidates_per_round, trials_per_round)
        check_confirm_top(confirm_top)
        self.trial_steps = trial_steps
        self.warmup = warmup
        self.probe_wait_steps = probe_wait_steps
        self.confirm_top = confirm_top
        self.candidates_per_round = candidates_per_round
        self.trials_per_round = trials_per_round
        self.seed = seed
        self.log_path = log_path
        self.show_progress = show_progress
        self.search_model = search_model
        self.extra_candidates = list(extra_candidates)
        self.cluster = cluster
        self.results: list[AutoResult] = []  # one per cluster searched, the latest last

    @property
    def result(self) -> AutoResult | None:
        """The latest finished search's result (None before one ended)."""
        return self.results[-1] if self.results else None

    @result.setter
    def result(self, value: AutoResult | None) -> None:
        """Records a finished search (replacing an earlier one for the same cluster); None forgets them all."""
        if value is None:
            self.results = []
            return
        self.results = [r for r in self.results if not _same_cluster(r.cluster, value.cluster)] + [value]

    def result_for(self, cluster: ClusterSpec) -> AutoResult | None:
        """The result of the search on a cluster of ``cluster``'s shape (as many workers, spread over hosts
        the same way in rank order), if any."""
        return next((r for r in reversed(self.results) if _same_cluster(r.cluster, cluster)), None)

    def build(self, variables: Sequence[VariableInfo], cluster: ClusterSpec) -> strategy_pb2.Strategy:
        """The best strategy found for ``cluster``; before the search (or on another cluster) all-reduce."""
        if not variables:
            raise no_trainable_variables_error()
        found = self.result_for(cluster)
        if found is not None:
            best = strategy_pb2.Strategy()
            best.CopyFrom(found.best)
            best.graph_config.replicas = cluster.replicas
            return best
        # The starting strategy is the all-reduce builder's, under its name (it is that strategy).
        return AllReduce().build(variables, cluster)

    def search_settings(self) -> dict[str, Any]:
        """What decides when and how this Auto searches: a joiner's must be the members' (JSON-able).

        Example:
            >>> Auto(budget=4, research_budget=2).search_settings()["research_budget"]
            2
        """
        return {
            "budget": [self.budget.trials, self.budget.seconds],
            "research_budget": None if self.research_budget is None else self.research_budget.trials,
            "trial_steps": self.trial_steps, "warmup": self.warmup, "probe_wait_steps": self.probe_wait_steps,
            "confirm_top": self.confirm_top, "candidates_per_round": self.candidates_per_round,
            "trials_per_round": self.trials_per_round, "seed": self.seed,
            "extra_candidates": [canonical_bytes(s).hex() for s in self.extra_candidates],
        }  # fmt: skip

    def result_record(self) -> list[dict[str, Any]]:
        """What a joiner needs to build what the members build: each cluster's result as JSON-able data.

        Empty before a search ended (or when it was abandoned): the members
        then re-build the all-reduce strategy, as the joiner does on its own.
        The trials' records stay with the members (they are the search log).

        Example:
            >>> Auto().result_record()
            []
        """
        return [
            {
                "best": canonical_bytes(r.best).hex(),
                "replicas": r.cluster.replicas,
                "hosts": [r.cluster.host_of(k) for k in range(r.cluster.replicas)],
                "best_seconds": r.best_seconds,
                "search_seconds": r.search_seconds,
            }
            for r in self.results
        ]

    def adopt_results(self, records: list[dict[str, Any]]) -> None:
        """Takes the members' search results (:meth:`result_record`), so this joiner builds what they build.

        A joiner's ``Auto`` never searched: without the members' results it
        would re-build the all-reduce strategy for a cluster they re-build
        their searched best for, and the consensus on the strategy bytes
        would fail when it is admitted.

        Raises:
            StrategyError: the records are not what :meth:`result_record` makes.

        Example:
            >>> a, b = Auto(), Auto()
            >>> b.adopt_results(a.result_record()); b.result is None
            True
        """
        results = []
        try:
            for record in records:
                best = strategy_pb2.Strategy.FromString(bytes.fromhex(record["best"]))
                cluster = ClusterSpec(int(record["replicas"]), tuple(int(h) for h in record["hosts"]))
                results.append(AutoResult(best, cluster, float(record["best_seconds"]),
                                          search_seconds=float(record["search_seconds"])))  # fmt: skip
        except (KeyError, TypeError, ValueError) as e:
            raise StrategyError(f"the members' Auto search results cannot be read here: {e!r}") from e
        self.results = results

    def config(self) -> dict[str, Any]:
        """Never: a search is not made again from settings (its trials' result and search model are state)."""
        raise StrategyError(
            "Auto.config(): a search holds its trials' result and its search model, which settings cannot carry; "
            "every worker re-runs its own Auto"
        )

    def nodes(self, variables: Sequence[VariableInfo], cluster: ClusterSpec) -> list[strategy_pb2.Node]:
        """The starting strategy's nodes: every variable all-reduced (the all-reduce builder's defaults)."""
        return AllReduce().nodes(variables, cluster)


def _same_cluster(a: ClusterSpec, b: ClusterSpec) -> bool:
    return a.replicas == b.replicas and all(a.host_of(r) == b.host_of(r) for r in range(a.replicas))


def is_auto(source: object) -> bool:
    """True if ``source`` asks for a search (an :class:`Auto` or the name ``"Auto"``)."""
    return isinstance(source, Auto) or (isinstance(source, str) and source == Auto.name)
