"""The learned ranker (AutoDist Eq. 3) and the choice of the next trials (score against diversity).

AutoDist refines its simulator with trial measurements, trained with a
ranking loss, and trusts it according to its *fidelity*. Here:

* **Model**: a pairwise logistic ranker (RankNet's loss on a linear score):
  for every pair of measured strategies whose times differ, the difference
  of their standardised feature vectors is labelled by which was faster,
  and scikit-learn's ``LogisticRegression`` (no intercept) learns weights w
  with P(a faster than b) = sigmoid(w . (x_a - x_b)). The score of a
  strategy is -w . x (lower is faster, like a time), one number per
  strategy, so candidates are ranked without comparing them in pairs.
  Linear keeps it learnable from the few trials a search can afford; the
  cost model's components are among the features, so it can stay as good
  as the cost model and learn how much each component really costs here.
* **Fidelity**: the ranker's pairwise accuracy on trials it was not trained
  on (leave one trial out, compare it with every other), next to the cost
  model's accuracy on the same pairs. :meth:`Ranker.scores` uses the ranker
  only when it has at least ``min_trials`` measurements and its fidelity
  beats the cost model's; otherwise it returns the cost model's prediction
  (feature column 0).
* **Trial choice** (:func:`select_trials`): greedy, as AutoTVM and AutoDist
  do, trading a candidate's score against its distance (in standardised
  feature space) to the candidates already chosen or measured; the weight
  of the score grows with the fidelity, so a ranker no better than a coin
  explores and a trusted one exploits.

Example:
    >>> import numpy as np
    >>> from kungfu_tf.strategy.auto.ranker import Ranker
    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(12, 3))
    >>> times = 2 * x[:, 1] + 10  # column 0 (the cost model's guess) knows nothing
    >>> r = Ranker(min_trials=4).fit(x, times)
    >>> r.fidelity > r.cost_model_accuracy, r.uses_ranker
    (True, True)
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from kungfu_tf.strategy.errors import StrategyError

# Two measurements closer than this (relative) are a tie: their order is noise, not a label.
DEFAULT_TIE_TOLERANCE = 0.01
# Scores and times: a list or a numpy vector.
Vector = Sequence[float] | np.ndarray


def _as_matrix(features: Any, what: str) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise StrategyError(f"ranker: {what} must be a 2-D array [strategies, features], got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise StrategyError(f"ranker: {what} has a non-finite value")
    return x


def pairwise_accuracy(scores: Vector, measured: Vector, tie_tolerance: float = DEFAULT_TIE_TOLERANCE) -> float:
    """Fraction of pairs (times apart by more than the tolerance) that ``scores`` order like ``measured``.

    Lower is faster for both. 0.5 when no pair can be judged.

    Example:
        >>> pairwise_accuracy([1, 2, 3], [10, 20, 30]), pairwise_accuracy([3, 2, 1], [10, 20, 30])
        (1.0, 0.0)
    """
    s, t = np.asarray(scores, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    right = judged = 0
    for i, j in itertools.combinations(range(len(t)), 2):
        if abs(t[i] - t[j]) <= tie_tolerance * max(abs(t[i]), abs(t[j])):
            continue
        judged += 1
        right += int(bool(s[i] < s[j]) == bool(t[i] < t[j]) and s[i] != s[j])
    return right / judged if judged else 0.5


class Ranker:
    """Ranks strategies from their feature vectors, refined by measured step times.

    Args:
        min_trials: measurements needed before the learned model is used at
            all (fewer: the cost model's column ranks alone).
        fallback_column: the feature column holding the cost model's
            predicted time (column 0 of :data:`~kungfu_tf.strategy.auto.features.FEATURE_NAMES`).
        regularization: inverse L2 strength of the logistic regression (its ``C``).
        tie_tolerance: relative difference below which two measurements make no pair.

    Example:
        >>> r = Ranker()
        >>> r.scores([[0.3, 1.0], [0.1, 5.0]]).tolist()  # no trials yet: the cost model's column
        [0.3, 0.1]
    """

    def __init__(
        self,
        min_trials: int = 4,
        fallback_column: int = 0,
        regularization: float = 1.0,
        tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    ) -> None:
        if min_trials < 2:
            raise ValueError(f"min_trials must be >= 2 (a ranking needs a pair), got {min_trials}")
        if not regularization > 0:
            raise ValueError(f"regularization must be > 0, got {regularization}")
        self.min_trials = min_trials
        self.fallback_column = fallback_column
        self.regularization = regularization
        self.tie_tolerance = tie_tolerance
        self.trials = 0
        self.fidelity = 0.5
        self.cost_model_accuracy = 0.5
        self._mean: np.ndarray | None = None
        self._scale: np.ndarray | None = None
        self._weights: np.ndarray | None = None

    def _pairs(self, z: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        diffs, labels = [], []
        for i, j in itertools.combinations(range(len(times)), 2):
            if abs(times[i] - times[j]) <= self.tie_tolerance * max(abs(times[i]), abs(times[j])):
                continue
            faster = 1 if times[i] < times[j] else 0
            diffs += [z[i] - z[j], z[j] - z[i]]  # both orders: balanced classes, no intercept needed
            labels += [faster, 1 - faster]
        return np.array(diffs), np.array(labels)

    def _train(self, x: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(mean, scale, weights) of a model fitted to ``x``/``times``; None if no pair differs."""
        from sklearn.linear_model import LogisticRegression

        mean = x.mean(axis=0)
        scale = x.std(axis=0)
        scale[scale == 0] = 1.0
        z = (x - mean) / scale
        diffs, labels = self._pairs(z, times)
        if len(labels) == 0:
            return None
        model = LogisticRegression(C=self.regularization, fit_intercept=False, max_iter=1000)
        model.fit(diffs, labels)
        return mean, scale, model.coef_[0].copy()

    @staticmethod
    def _score(fitted: tuple[np.ndarray, np.ndarray, np.ndarray], x: np.ndarray) -> np.ndarray:
        mean, scale, weights = fitted
        return -((x - mean) / scale) @ weights  # P(faster) grows with w . x: lower score, faster

    def fit(self, features: Any, measured_times: Vector) -> Ranker:
        """Trains on every measurement so far (rows of ``features``, step times in seconds); returns self.

        Also estimates the fidelity (leave-one-trial-out pairwise accuracy)
        and the cost model's accuracy on the same trials.
        """
        x = _as_matrix(features, "features")
        times = np.asarray(measured_times, dtype=np.float64)
        if times.shape != (len(x),):
            raise StrategyError(f"ranker: {len(x)} feature rows but {times.size} measured times")
        if not np.all(np.isfinite(times)) or np.any(times <= 0):
            raise StrategyError("ranker: measured times must be finite and > 0 seconds (score a failed trial as slow, not as 0)")
        self.trials = len(x)
        self.cost_model_accuracy = pairwise_accuracy(x[:, self.fallback_column], times, self.tie_tolerance)
        fitted = self._train(x, times) if len(x) >= 2 else None
        if fitted is None:
            self._mean = self._scale = self._weights = None
            self.fidelity = 0.5
            return self
        self._mean, self._scale, self._weights = fitted
        self.fidelity = self._held_out_accuracy(x, times)
        return self

    def _held_out_accuracy(self, x: np.ndarray, times: np.ndarray) -> float:
        right = judged = 0
        for i in range(len(x)):
            rest = np.arange(len(x)) != i
            fitted = self._train(x[rest], times[rest])
            if fitted is None:
                continue
            s = self._score(fitted, x)
            for j in np.flatnonzero(rest):
                if abs(times[i] - times[j]) <= self.tie_tolerance * max(times[i], times[j]):
                    continue
                judged += 1
                right += int(bool(s[i] < s[j]) == bool(times[i] < times[j]))
        return right / judged if judged else 0.5

    @property
    def uses_ranker(self) -> bool:
        """True when the learned model ranks (enough trials, and it beats the cost model on held-out pairs)."""
        return bool(
            self._weights is not None and self.trials >= self.min_trials and self.fidelity > self.cost_model_accuracy
        )

    def predict(self, features: Any) -> np.ndarray:
        """The learned model's scores (lower is faster); the cost model's column before any fit."""
        x = _as_matrix(features, "features")
        if self._weights is None:
            return x[:, self.fallback_column].copy()
        assert self._mean is not None and self._scale is not None
        return self._score((self._mean, self._scale, self._weights), x)

    def scores(self, features: Any) -> np.ndarray:
        """What to rank candidates by: the learned scores when trusted (:attr:`uses_ranker`), else the cost model's."""
        x = _as_matrix(features, "features")
        return self.predict(x) if self.uses_ranker else x[:, self.fallback_column].copy()

    @property
    def trust(self) -> float:
        """The fidelity to pass to :func:`select_trials`: the ranker's when it ranks, else the cost model's."""
        return self.fidelity if self.uses_ranker else max(self.cost_model_accuracy, 0.5)


def select_trials(
    candidates: Any,
    scores: Vector,
    k: int,
    fidelity: float,
    measured: Any = None,
    exclude: Sequence[int] = (),
) -> list[int]:
    """Indices of ``k`` candidates to try next, best first: good scores, far from each other.

    ``candidates``: [n, d] feature vectors; ``scores``: lower is better;
    ``fidelity``: pairwise accuracy of the scores (0.5: a coin, 1: perfect);
    ``measured``: feature vectors already measured (kept away from);
    ``exclude``: candidate indices not to pick (e.g. measured ones).
    Greedy: each pick maximises ``a * quality + (1 - a) * novelty``, where
    quality is 1 for the best score and 0 for the worst, novelty is the
    distance to the nearest chosen or measured vector over the largest such
    distance, and ``a = 2 * (fidelity - 0.5)`` clipped to [0, 1]. The first
    pick is the best score whatever the fidelity (nothing is chosen yet).

    Raises:
        StrategyError: k < 1, or scores and candidates of different lengths.

    Example:
        >>> x = [[0.0], [0.1], [0.2], [5.0]]
        >>> select_trials(x, [1.0, 1.1, 1.2, 3.0], k=2, fidelity=1.0)  # trusted: the two best
        [0, 1]
        >>> select_trials(x, [1.0, 1.1, 1.2, 3.0], k=2, fidelity=0.5)  # a coin: the best, then the farthest
        [0, 3]
    """
    if k < 1:
        raise StrategyError(f"select_trials: k must be >= 1 trial, got {k}")
    x = _as_matrix(candidates, "candidates")
    s = np.asarray(scores, dtype=np.float64)
    if s.shape != (len(x),):
        raise StrategyError(f"select_trials: {len(x)} candidates but {s.size} scores")
    available = [i for i in range(len(x)) if i not in set(exclude)]
    if not available:
        return []
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale == 0] = 1.0
    z = (x - mean) / scale
    spread = float(np.ptp(s[available])) or 1.0
    quality = 1.0 - (s - s[available].min()) / spread
    exploit = float(np.clip(2 * (fidelity - 0.5), 0.0, 1.0))
    anchors = [((np.asarray(m, dtype=np.float64) - mean) / scale) for m in _as_matrix(measured, "measured")] if measured is not None and len(measured) else []
    chosen: list[int] = []
    while available and len(chosen) < k:
        if not anchors:
            best = min(available, key=lambda i: (s[i], i))
        else:
            nearest = np.array([min(float(np.linalg.norm(z[i] - a)) for a in anchors) for i in available])
            novelty = nearest / (nearest.max() or 1.0)
            value = exploit * quality[available] + (1 - exploit) * novelty
            best = available[int(np.argmax(value))]  # the first (lowest index) on a tie
        chosen.append(best)
        anchors.append(z[best])
        available.remove(best)
    return chosen
