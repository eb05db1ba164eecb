"""``CostModelScorer``: a ``StrategyPolicy`` scorer that predicts each candidate's step time from measured links.

AutoDist's predefined simulator (kungfu_tf/strategy/auto/cost_model.py) on
link rates measured on the running job at the moment of scoring
(``calibrate(refresh=True)``: a trigger means the links or the cluster
changed, so a cached measurement would be stale). Collective, like every
scorer: the policy calls it on every worker at the same step.

Example:
    >>> from kungfu_tf.policy import StrategyPolicy
    >>> policy = StrategyPolicy(opt, ["AllReduce", "PartitionedPS"], scorer=CostModelScorer())   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.auto.calibration import calibrate
from kungfu_tf.strategy.auto.cost_model import CostModel
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.variable_info import VariableInfo


class CostModelScorer:
    """Predicted seconds per step of each candidate: ``cost_model.predict(...).step_time`` on fresh link rates.

    Args:
        cost_model: the :class:`~kungfu_tf.strategy.auto.cost_model.CostModel` (default settings if None).
        compute_time: seconds of a step's own computation, added to every
            prediction (it does not change the ranking).
        probe_bytes, repeats: the calibration probe's size and repeats
            (``calibrate``'s defaults if None).

    Example:
        >>> scorer = CostModelScorer(compute_time=0.01)
        >>> scorer.compute_time
        0.01
    """

    def __init__(self, cost_model: CostModel | None = None, compute_time: float = 0.0,
                 probe_bytes: int | None = None, repeats: int | None = None) -> None:  # fmt: skip
        self.cost_model = cost_model if cost_model is not None else CostModel()
        if compute_time < 0:
            raise ValueError(f"CostModelScorer: compute_time must be >= 0 s, got {compute_time}")
        self.compute_time = compute_time
        self._probe: dict[str, int] = {}
        if probe_bytes is not None:
            self._probe["probe_bytes"] = probe_bytes
        if repeats is not None:
            self._probe["repeats"] = repeats

    def __call__(self, candidates: list[strategy_pb2.Strategy], variables: Sequence[VariableInfo], ctx: Any) -> list[float]:
        rates = calibrate(refresh=True, **self._probe)  # type: ignore[arg-type]
        cluster = ClusterSpec.current()
        return [self.cost_model.predict(s, variables, cluster, rates, self.compute_time).step_time for s in candidates]
