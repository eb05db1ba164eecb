"""What a resize does to the batch and the learning rate (PolicyRunner(on_resize=..., max_global_batch_size=...)).

In one process: the runner reads the cluster size through ``kungfu_tf.ops.config.current_int``, which the
test answers (as an elastic resize would change it), then calls ``refresh_cluster`` (what the runner's
elastic apply listener calls after every membership change, before the state syncs). The references are
written out by hand from the rules (Or et al. §2.2: fix the local batch until the user's maximum global
batch is crossed).
"""

from __future__ import annotations

import keras
import pytest

from kungfu_tf.ops import config
from kungfu_tf.policy import PolicyRunner
from kungfu_tf.policy.resize_batch import ResizeBatchRule


@pytest.fixture
def cluster(monkeypatch):
    """``cluster["size"] = n`` resizes the (pretend) cluster."""
    state = {"size": 1}
    real = config.current_int

    def current_int(op):
        if op is config.cluster_size:
            return state["size"]
        if op is config.rank:
            return 0
        return real(op)

    monkeypatch.setattr(config, "current_int", current_int)
    return state


def runner_at(cluster, size, lr_rule=None, **kw):
    cluster["size"] = size
    opt = keras.optimizers.SGD(0.1)
    opt.build([keras.Variable(1.0)])
    runner = PolicyRunner([], batch_size=64 * size, optimizer=opt, lr_rule=lr_rule, verbose=False, **kw)
    runner.before_train()
    return runner, opt


def resize(runner, cluster, size):
    cluster["size"] = size
    runner.refresh_cluster()
    return runner.batch_size, int(runner.local_batch_size.numpy())


def test_rule_per_size():
    capped = ResizeBatchRule("keep_local", max_global_batch_size=256)
    assert [capped.local_batch(n, wanted=64) for n in (1, 2, 3, 4, 5, 8, 300)] == [64, 64, 64, 64, 51, 32, 1]
    keep = ResizeBatchRule("keep_global")
    assert [keep.local_batch(n, wanted=96) for n in (1, 2, 5, 96, 200)] == [96, 48, 19, 1, 1]
    with pytest.raises(ValueError, match="on_resize must be one of keep_local, keep_global, got 'grow'"):
        ResizeBatchRule("grow")
    with pytest.raises(ValueError, match="max_global_batch_size must be a positive int or None, got 0"):
        ResizeBatchRule("keep_local", 0)
    with pytest.raises(ValueError, match="caps the growing global batch of on_resize='keep_local', not 'keep_global'"):
        ResizeBatchRule("keep_global", 128)


def test_keep_local_grows_the_global_batch_up_to_the_cap_and_back(cluster):
    runner, _ = runner_at(cluster, 2, max_global_batch_size=256)
    assert (runner.batch_size, int(runner.local_batch_size.numpy())) == (128, 64)
    assert resize(runner, cluster, 4) == (256, 64)
    assert resize(runner, cluster, 8) == (256, 32)  # past the cap the per-worker batch shrinks
    assert resize(runner, cluster, 3) == (192, 64)  # and grows back to the wanted 64
    steps = [(d.old, d.new) for d in runner.history if d.name == "batch_size"]
    assert steps == [(128, 256), (256, 192)]


def test_keep_global_splits_the_same_batch_and_drops_the_remainder(cluster):
    runner, _ = runner_at(cluster, 2, on_resize="keep_global")
    assert resize(runner, cluster, 4) == (128, 32)
    assert resize(runner, cluster, 5) == (125, 25)  # 128 // 5 = 25 each: 3 samples a step dropped
    assert resize(runner, cluster, 2) == (128, 64)  # the wanted 128 comes back


@pytest.mark.parametrize(("rule", "factor"), [("linear", 2.0), ("sqrt", 2.0**0.5)])
def test_the_learning_rate_follows_a_global_batch_that_a_resize_changed(cluster, rule, factor):
    runner, opt = runner_at(cluster, 2, lr_rule=rule)
    resize(runner, cluster, 4)  # keep_local: the global batch doubles
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.1 * factor, rel=1e-6)
    assert runner.learning_rate == pytest.approx(0.1 * factor, rel=1e-6)
    resize(runner, cluster, 2)
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.1, rel=1e-6)
    first = next(d for d in runner.history if d.name == "learning_rate")
    assert first.requested_by == f"lr_rule={rule}" and "from 2 to 4 workers" in first.reason


def test_keep_global_leaves_the_learning_rate_alone(cluster):
    runner, opt = runner_at(cluster, 2, lr_rule="linear", on_resize="keep_global")
    resize(runner, cluster, 4)
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.1) and runner.batch_size == 128


def test_a_joiner_adopts_the_members_batch_and_rate_instead_of_scaling_its_own(cluster):
    members, member_opt = runner_at(cluster, 2, lr_rule="linear", max_global_batch_size=512)
    resize(members, cluster, 3)  # the members refresh first (192, lr 0.15), then the state syncs
    joiner, joiner_opt = runner_at(cluster, 1, lr_rule="linear", max_global_batch_size=512)
    cluster["size"] = 3
    joiner_opt.learning_rate.assign(member_opt.learning_rate)  # the sync assigns the variables first
    joiner.load_state_dict(members.state_dict())
    assert joiner.state_dict() == members.state_dict()
    assert joiner.batch_size == members.batch_size == 192
    assert joiner.learning_rate == pytest.approx(members.learning_rate) == pytest.approx(0.15, rel=1e-6)
