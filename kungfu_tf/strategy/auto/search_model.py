"""The search model of ``builders.Auto``: the sampler, the calibrated cost model and the ranker, behind one object.

:class:`~kungfu_tf.strategy.auto.search.Search` (AutoDist's Algorithm 1)
asks its model to sample candidates, predict their step time, learn from
trials, say how far it trusts itself and pick the trials; this class
answers with the pieces of ``kungfu_tf.strategy.auto``:

* candidates: :func:`~kungfu_tf.strategy.auto.sampler.sample_strategies`
  (the hand builders' strategies, then guided samples);
* predictions: the cost model's per-step time (sync time from the link
  rates, plus the compute time) until the ranker has learned from a round
  of trials, then the ranker's (Eq. 3: the cost model's components and raw
  features of the variables and the strategy);
* compute time: not measured apart; the first successful trial's measured
  step time less the cost model's sync time for it (AutoDist's T =
  max(T_comp, T_sync) needs no more), 0 until then;
* trial selection: :func:`~kungfu_tf.strategy.auto.ranker.select_trials`
  (score against diversity, above the ranker's fidelity level).

Every input is agreed (the sampler's seed, the calibrated rates, the
trials' agreed measurements), so every worker's model makes the same choices.

Example:
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> m = AutoDistModel.declared([VariableInfo("w", (64, 64)), VariableInfo("b", (64,))], ClusterSpec(2))
    >>> candidates = m.sample(4, seed=0)
    >>> len(candidates), all(p > 0 for p in m.predict(candidates))
    (4, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.cost_model import CostBreakdown, CostModel
from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.auto.sampler import SamplerOptions, sample_strategies
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.variable_info import VariableInfo


class AutoDistModel:
    """Sampler + cost model on ``rates`` + ranker, for ``variables`` on ``cluster`` (module docstring).

    Args:
        use_ranker: False keeps the cost model's predictions for the whole
            search (the "cost model alone" baseline of the benchmark).

    Example:
        >>> from kungfu_tf.strategy.variable_info import VariableInfo
        >>> AutoDistModel.declared([VariableInfo("w", (4,))], ClusterSpec(2), use_ranker=False).fidelity()
        0.0
    """

    def __init__(
        self,
        variables: Sequence[VariableInfo],
        cluster: ClusterSpec,
        rates: LinkRates,
        cost_model: CostModel | None = None,
        sampler_options: SamplerOptions | None = None,
        use_ranker: bool = True,
    ) -> None:
        self.variables = list(variables)
        self.cluster = cluster
        self.rates = rates
        self.cost_model = cost_model or CostModel()
        self.sampler_options = sampler_options
        self.use_ranker = use_ranker
        self.compute_time = 0.0
        self._ranker: Any = None  # a fitted kungfu_tf.strategy.auto.ranker.Ranker, after the first round
        self._breakdowns: dict[bytes, CostBreakdown] = {}

    @classmethod
    def calibrated(cls, variables: Sequence[VariableInfo], cluster: ClusterSpec, **options: Any) -> AutoDistModel:
        """With the running job's measured link rates (collective; cached per cluster)."""
        from kungfu_tf.strategy.auto.calibration import calibrate

        return cls(variables, cluster, calibrate(), **options)

    @classmethod
    def declared(cls, variables: Sequence[VariableInfo], cluster: ClusterSpec, **options: Any) -> AutoDistModel:
        """With uniform declared rates (``cluster.bandwidth_gbps`` between hosts); nothing is measured."""
        return cls(variables, cluster, LinkRates.for_cluster(cluster), **options)

    def breakdown(self, strategy: strategy_pb2.Strategy) -> CostBreakdown:
        """The cost model's prediction for ``strategy`` (sync components, without compute time)."""
        key = canonical_bytes(strategy)
        if key not in self._breakdowns:
            self._breakdowns[key] = self.cost_model.predict(strategy, self.variables, self.cluster, self.rates)
        return self._breakdowns[key]

    def sample(self, count: int, seed: int) -> list[strategy_pb2.Strategy]:
        return sample_strategies(self.variables, self.cluster, count, seed, self.sampler_options)

    def cost_model_predict(self, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        return [self.compute_time + self.breakdown(s).sync_time for s in strategies]

    def predict(self, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        if self._ranker is None:
            return self.cost_model_predict(strategies)
        return [float(x) for x in self._ranker.predict(self._features(strategies))]

    def learn(self, strategies: Sequence[strategy_pb2.Strategy], measured: Sequence[float]) -> None:
        done = [(s, m) for s, m in zip(strategies, measured, strict=True) if not math.isinf(m)]
        if done and self.compute_time == 0.0:
            first, seconds = done[0]
            self.compute_time = max(0.0, seconds - self.breakdown(first).sync_time)
        if not self.use_ranker or len(done) < 2:
            return
        from kungfu_tf.strategy.auto.ranker import Ranker

        ranker = self._ranker or Ranker()
        ranker.fit(self._features([s for s, _ in done]), [m for _, m in done])
        self._ranker = ranker

    def fidelity(self) -> float:
        return 0.0 if self._ranker is None else float(self._ranker.fidelity)

    def select(self, candidates: Sequence[strategy_pb2.Strategy], scores: Sequence[float], k: int) -> list[int]:
        from kungfu_tf.strategy.auto.ranker import select_trials

        return list(select_trials(candidates, scores, k, self.fidelity()))

    def _features(self, strategies: Sequence[strategy_pb2.Strategy]) -> Any:
        from kungfu_tf.strategy.auto.features import strategy_features

        return [strategy_features(s, self.variables, self.cluster, self.breakdown(s)) for s in strategies]
