"""The learned ranker and the trial choice.

The ranker must learn an ordering the cost model gets wrong: the "measured"
times come from a different truth than the cost model's column (a cost
model deliberately miscalibrated), and on strategies it was not trained on
the ranker must order more pairs correctly than the cost model does.
"""

from __future__ import annotations

import numpy as np
import pytest

from kungfu_tf.strategy.auto.cost_model import CostModel
from kungfu_tf.strategy.auto.features import FEATURE_NAMES, feature_matrix
from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.auto.ranker import Ranker, pairwise_accuracy, select_trials
from kungfu_tf.strategy.auto.sampler import sample_strategies
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.variable_info import VariableInfo


def synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Features [cost model's guess, bandwidth s, latency s, 3 noise columns] and true times.

    The guess weighs latency a tenth of what it costs.
    """
    rng = np.random.default_rng(seed)
    bandwidth = rng.uniform(0.01, 0.1, n)
    latency = rng.uniform(0.0, 0.1, n)
    guess = bandwidth + 0.1 * latency
    x = np.column_stack([guess, bandwidth, latency, rng.normal(size=(n, 3))])
    times = bandwidth + latency + 0.2 + rng.normal(0, 0.002, n)
    return x, times


def test_ranker_beats_a_miscalibrated_cost_model_on_held_out_strategies():
    x_train, t_train = synthetic(20, seed=1)
    x_test, t_test = synthetic(60, seed=2)
    ranker = Ranker().fit(x_train, t_train)
    cost_model = pairwise_accuracy(x_test[:, 0], t_test)
    learned = pairwise_accuracy(ranker.scores(x_test), t_test)
    assert ranker.uses_ranker
    assert learned > 0.9
    assert learned > cost_model + 0.1, (learned, cost_model)
    # Its own estimate agrees: held-out trials were ordered better than by the cost model.
    assert ranker.fidelity > ranker.cost_model_accuracy


def test_ranker_learns_from_real_features_when_the_links_were_misjudged():
    """Cost model assumes one even network; the cluster really has a slow, high-latency link between hosts."""
    vs = [VariableInfo("emb", (20000, 32), sparse=True)] + [
        VariableInfo(f"layer{i}/kernel", (256, 256 * (1 + i % 3))) for i in range(8)
    ] + [VariableInfo(f"layer{i}/bias", (256,)) for i in range(8)]
    cluster = ClusterSpec(4, hosts=(0, 0, 1, 1))
    assumed = LinkRates.uniform(4, 2e9, 20e-6, hosts=cluster.hosts)
    real = LinkRates.uniform(4, 2e9, 20e-6, hosts=cluster.hosts, cross_host_bandwidth=5e7, cross_host_latency=2e-3)
    candidates = sample_strategies(vs, cluster, 80, seed=0)
    x, _ = feature_matrix(candidates, vs, cluster, assumed, compute_time=0.05)
    truth = np.array([CostModel().predict(s, vs, cluster, real, 0.05).step_time for s in candidates])
    train, test = np.arange(0, 80, 3), np.setdiff1d(np.arange(80), np.arange(0, 80, 3))
    ranker = Ranker().fit(x[train], truth[train])
    cost_model = pairwise_accuracy(x[test, 0], truth[test])
    learned = pairwise_accuracy(ranker.scores(x[test]), truth[test])
    assert learned > cost_model, (learned, cost_model)
    assert x.shape[1] == len(FEATURE_NAMES)


def test_too_few_trials_fall_back_to_the_cost_model():
    x, t = synthetic(3, seed=3)
    ranker = Ranker(min_trials=4).fit(x, t)
    assert not ranker.uses_ranker
    assert ranker.scores(x).tolist() == x[:, 0].tolist()
    assert Ranker().scores(x).tolist() == x[:, 0].tolist()  # never fitted


def test_a_perfect_cost_model_is_kept():
    x, t = synthetic(12, seed=4)
    x[:, 0] = t  # the cost model is right: nothing can beat it on held-out pairs
    ranker = Ranker().fit(x, t)
    assert ranker.cost_model_accuracy == 1.0
    assert not ranker.uses_ranker
    assert ranker.scores(x).tolist() == t.tolist()
    assert ranker.trust == 1.0


def test_select_trials_exploits_when_trusted_and_explores_when_not():
    rng = np.random.default_rng(5)
    near = rng.normal(0, 0.1, size=(6, 2))  # one cluster, the best scores
    far = rng.normal(10, 0.1, size=(6, 2))  # another, worse scores
    x = np.vstack([near, far])
    scores = np.concatenate([np.linspace(1.0, 1.5, 6), np.linspace(2.0, 2.5, 6)])
    assert select_trials(x, scores, 3, fidelity=1.0) == [0, 1, 2]
    coin = select_trials(x, scores, 3, fidelity=0.5)
    assert coin[0] == 0 and any(i >= 6 for i in coin)
    # Measured vectors count as chosen; excluded indices are never picked.
    assert 0 not in select_trials(x, scores, 4, fidelity=0.9, measured=x[:1], exclude=[0])
    assert select_trials(x, scores, 20, fidelity=1.0) == sorted(range(12), key=lambda i: scores[i])


def test_bad_input_is_a_precise_error():
    x, t = synthetic(5, seed=6)
    with pytest.raises(StrategyError, match="k must be >= 1 trial, got 0"):
        select_trials(x, t, 0, fidelity=0.9)
    with pytest.raises(StrategyError, match="5 candidates but 4 scores"):
        select_trials(x, t[:4], 2, fidelity=0.9)
    with pytest.raises(StrategyError, match="5 feature rows but 4 measured times"):
        Ranker().fit(x, t[:4])
    with pytest.raises(StrategyError, match="measured times must be finite and > 0"):
        Ranker().fit(x, np.zeros(5))
    with pytest.raises(StrategyError, match="must be a 2-D array"):
        Ranker().scores(np.zeros(3))
