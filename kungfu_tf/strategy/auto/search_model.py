"""The search model of ``builders.Auto``: the sampler, the calibrated cost model and the ranker, behind one object.

:class:`~kungfu_tf.strategy.auto.search.Search` (AutoDist's Algorithm 1)
asks its model to sample candidates, predict their step time, learn from
trials, say how far it trusts itself and pick the trials; this class
answers with the pieces of ``kungfu_tf.strategy.auto``:

* candidates: :func:`~kungfu_tf.strategy.auto.sampler.sample_strategies`
  (the hand builders' strategies, then guided samples);
* scores: the cost model's per-step time (sync time from the link rates,
  plus the compute time) until the ranker has learned from enough trials
  and beats the cost model on held-out pairs, then the ranker's (Eq. 3: the
  cost model's components and raw features of the variables and the
  strategy; a ranking score, not seconds);
* compute time: not measured apart; the first successful trial's measured
  step time less the cost model's sync time for it (AutoDist's T =
  max(T_comp, T_sync) needs no more), 0 until then;
* trial selection: :func:`~kungfu_tf.strategy.auto.ranker.select_trials`
  (score against distance to what was measured, weighted by the fidelity).

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

import numpy as np

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.cost_model import CostBreakdown, CostModel
from kungfu_tf.strategy.auto.features import FEATURE_NAMES, strategy_features
from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.auto.ranker import Ranker, select_trials
from kungfu_tf.strategy.auto.sampler import SamplerOptions, sample_strategies
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.format import canonical_bytes
from kungfu_tf.strategy.variable_info import VariableInfo


class AutoDistModel:
    """Sampler + cost model on ``rates`` + ranker, for ``variables`` on ``cluster`` (module docstring).

    Args:
        use_ranker: False ranks by the cost model for the whole search (the
            "cost model alone" baseline of the benchmark); the trials'
            choice still trades score against diversity, by the cost model's
            measured accuracy.

    Example:
        >>> from kungfu_tf.strategy.variable_info import VariableInfo
        >>> AutoDistModel.declared([VariableInfo("w", (4,))], ClusterSpec(2), use_ranker=False).fidelity()
        0.5
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
        self.ranker = Ranker()
        self._measured: list[np.ndarray] = []
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
        """The cost model's prediction for ``strategy``, with the compute time estimated so far."""
        key = canonical_bytes(strategy) + str(self.compute_time).encode()
        if key not in self._breakdowns:
            self._breakdowns[key] = self.cost_model.predict(
                strategy, self.variables, self.cluster, self.rates, self.compute_time
            )
        return self._breakdowns[key]

    def sample(self, count: int, seed: int) -> list[strategy_pb2.Strategy]:
        return sample_strategies(self.variables, self.cluster, count, seed, self.sampler_options)

    def cost_model_predict(self, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        return [self.breakdown(s).step_time for s in strategies]

    def predict(self, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        if not self.use_ranker:
            return self.cost_model_predict(strategies)
        return [float(x) for x in self.ranker.scores(self._features(strategies))]

    def learn(self, strategies: Sequence[strategy_pb2.Strategy], measured: Sequence[float]) -> None:
        done = [(s, m) for s, m in zip(strategies, measured, strict=True) if not math.isinf(m)]
        if not done:
            return
        if self.compute_time == 0.0:
            first, seconds = done[0]
            self.compute_time = max(0.0, seconds - self.breakdown(first).sync_time)
        features = self._features([s for s, _ in done])
        self._measured = list(features)
        # Fitted in both modes: without the ranker its accuracy still measures the cost model's (fidelity).
        self.ranker.fit(features, [m for _, m in done])

    def fidelity(self) -> float:
        if self.use_ranker and self.ranker.trials:
            return float(self.ranker.trust)
        return max(0.5, float(self.ranker.cost_model_accuracy))

    def select(self, candidates: Sequence[strategy_pb2.Strategy], scores: Sequence[float], k: int) -> list[int]:
        measured = np.stack(self._measured) if self._measured else None
        return list(select_trials(self._features(candidates), scores, k, self.fidelity(), measured=measured))

    def _features(self, strategies: Sequence[strategy_pb2.Strategy]) -> np.ndarray:
        rows = [strategy_features(s, self.variables, self.cluster, self.breakdown(s)) for s in strategies]
        return np.stack(rows) if rows else np.zeros((0, len(FEATURE_NAMES)))
