"""Adaptation policies in one process (a one-worker cluster): adaptive_batch, learning-rate rules,
hysteresis against an oscillating policy, GNSBatchSizePolicy's decisions, bad arguments.

The multi-worker behaviour is in tests/test_policy.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.data import adaptive_batch
from kungfu_tf.ops import membership
from kungfu_tf.policy import (
    BasePolicy,
    GNSBatchSizePolicy,
    PolicyRunner,
    scaled_learning_rate,
)
from kungfu_tf.policy.hysteresis import Hysteresis


def test_adaptive_batch_follows_the_variable_at_once_without_retracing():
    size = tf.Variable(2, dtype=tf.int64)
    ds = adaptive_batch(tf.data.Dataset.range(100).map(lambda i: (i, tf.fill([2], i))), size, granularity=1)
    assert ds.element_spec[0].shape.as_list() == [None] and ds.element_spec[1].shape.as_list() == [None, 2]

    @tf.function
    def step(iterator):
        x, _ = next(iterator)
        return x

    it = iter(ds)
    got, start = [], 0
    for want in (2, 3, 5, 1, 4):
        size.assign(want)
        batch = step(it).numpy()
        got.append(batch.tolist())
        assert batch.tolist() == list(range(start, start + want)), (want, batch)
        start += want
    assert step.experimental_get_tracing_count() == 1


def test_adaptive_batch_granularity_and_leftovers():
    size = tf.Variable(4, dtype=tf.int64)
    it = iter(adaptive_batch(tf.data.Dataset.range(11), size, granularity=4))
    assert next(it).numpy().tolist() == [0, 1, 2, 3]
    size.assign(6)  # not a multiple: rows left over start the next batch
    assert next(it).numpy().tolist() == [4, 5, 6, 7, 8, 9]
    with pytest.raises(StopIteration):  # an incomplete last batch is dropped
        next(it)


def test_adaptive_batch_rejects_bad_arguments():
    with pytest.raises(TypeError, match="batch_size must be an int64 scalar tf.Variable"):
        adaptive_batch(tf.data.Dataset.range(4), tf.Variable(2))  # int32
    with pytest.raises(ValueError, match="granularity must be a positive int, got 0"):
        adaptive_batch(tf.data.Dataset.range(4), tf.Variable(2, dtype=tf.int64), granularity=0)


def test_learning_rate_rules_against_their_formulas():
    assert scaled_learning_rate("linear", 0.1, 64, 256) == pytest.approx(0.4)
    assert scaled_learning_rate("sqrt", 0.1, 64, 256) == pytest.approx(0.2)
    # AdaScale (Johnson et al.): gain(B) = (σ²_B0 + μ²) / (σ²_B0·B0/B + μ²), σ²_B0 = tr(Σ)/B0.
    trace, g2, b0 = 300.0, 2.0, 32

    def gain(b):
        return (trace / b0 + g2) / (trace / b + g2)

    got = scaled_learning_rate("adascale", 0.1, 64, 256, {"noise_trace": trace, "grad_sq_norm": g2})
    assert got == pytest.approx(0.1 * gain(256) / gain(64))
    assert 0.1 < got < 0.4  # between no scaling and linear
    with pytest.raises(ValueError, match="lr_rule='adascale' needs the GradientMonitor's 'noise_trace'"):
        scaled_learning_rate("adascale", 0.1, 64, 128, {"noise_trace": math.nan, "grad_sq_norm": 1.0})
    # The unbiased estimates can be negative: clamped at 0 (tr(Σ) = 0: no scaling; |G|² = 0: linear).
    assert scaled_learning_rate("adascale", 0.1, 64, 256, {"noise_trace": -5.0, "grad_sq_norm": g2}) == pytest.approx(0.1)
    assert scaled_learning_rate("adascale", 0.1, 64, 256, {"noise_trace": trace, "grad_sq_norm": -1.0}) == pytest.approx(0.4)
    assert scaled_learning_rate("adascale", 0.1, 64, 256, {"noise_trace": -1.0, "grad_sq_norm": -1.0}) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="lr_rule must be one of linear, sqrt, adascale or None, got 'cubic'"):
        scaled_learning_rate("cubic", 0.1, 64, 128)


class Oscillating(BasePolicy):
    """Asks for 4 and 8 alternately after every step (what AdaptDL's batch did)."""

    def after_step(self, ctx):
        ctx.set_batch_size(8 if ctx.batch_size == 4 else 4)


def batch_per_step(steps: int, **hysteresis) -> list[int]:
    runner = PolicyRunner([Oscillating()], batch_size=4, verbose=False, **hysteresis)
    sizes = []
    with runner.training():
        for _ in range(steps):
            with runner.step():
                sizes.append(int(runner.local_batch_size.numpy()))
    return sizes


def test_hysteresis_stops_oscillation():
    assert batch_per_step(6) == [4, 8, 4, 8, 4, 8]  # without it: a change after every step
    assert batch_per_step(9, min_dwell_steps=3) == [4, 8, 8, 8, 4, 4, 4, 8, 8]
    assert batch_per_step(5, min_relative_change=1.5) == [4] * 5  # x2 / x0.5 are too small
    with pytest.raises(ValueError, match="min_dwell_steps must be an int >= 0, got -1"):
        Hysteresis(min_dwell_steps=-1)


class FakeContext:
    """The part of PolicyContext GNSBatchSizePolicy uses; applies requests at once."""

    def __init__(self, batch_size: int, size: int = 2):
        self.batch_size, self.size, self.step, self.epoch = batch_size, size, 0, 0
        self.metrics: dict = {}
        self.requests: list[int] = []

    def set_batch_size(self, value, reason=""):
        self.requests.append(value)
        self.batch_size = value


def test_gns_policy_scales_by_growth_bounded_and_rounded():
    policy = GNSBatchSizePolicy(max_batch_size=200, threshold=1.5, every=1, round_to=4)
    ctx = FakeContext(batch_size=16, size=2)
    for gns in (10.0, 12.0, 17.0, 20.0, 40.0, 1000.0):
        ctx.metrics["gns"] = gns
        policy.after_step(ctx)
    # 17/10 = 1.7 -> 16*1.7 = 27.2 -> multiple of 8: 24; then ref 17: 20 is x1.18;
    # 40/17 = 2.35 -> 56.4 -> 56; 1000/40 -> capped at 200 -> 200.
    assert ctx.requests == [24, 56, 200]
    ctx.metrics["gns"] = 1e6
    policy.after_step(ctx)
    assert ctx.requests == [24, 56, 200]  # at the maximum: no request


def test_gns_policy_keeps_its_reference_when_a_change_was_refused():
    policy = GNSBatchSizePolicy(max_batch_size=1000, threshold=1.5, every=1)
    ctx = FakeContext(batch_size=10, size=1)
    ctx.set_batch_size = lambda value, reason="": ctx.requests.append(value)  # refused: batch stays
    for gns in (10.0, 16.0, 16.0):
        ctx.metrics["gns"] = gns
        policy.after_step(ctx)
    assert ctx.requests == [16, 16]  # still x1.6 from the reference 10, asked again
    ctx.metrics["gns"] = math.nan
    policy.after_step(ctx)
    assert ctx.requests == [16, 16]  # no estimate: no decision


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be a positive int, got 0"),
        ({"max_batch_size": 64, "threshold": 1.0}, "threshold must be a number > 1, got 1.0"),
        ({"max_batch_size": 64, "unit": "minute"}, "unit must be one of step, epoch, got 'minute'"),
    ],
)
def test_gns_policy_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GNSBatchSizePolicy(**kwargs)


def test_runner_rejects_bad_arguments_and_calls_outside_hooks():
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        PolicyRunner([], batch_size=0)
    with pytest.raises(TypeError, match=r"policies\[0\] must be a kungfu_tf.policy.BasePolicy"):
        PolicyRunner([object()])
    runner = PolicyRunner([], batch_size=4, verbose=False)
    runner.before_train()
    with pytest.raises(RuntimeError, match="set_batch_size may only be called from a policy hook"):
        runner.context.set_batch_size(8)
    assert np.array_equal(runner.local_batch_size.numpy(), 4)


class ListingOne(BasePolicy):
    """The README's custom policy (KungFu's Listing 1 on kungfu_tf), verbatim."""

    needs_monitor = True

    def __init__(self):
        self.prev = None

    def after_epoch(self, ctx):
        gns = ctx.metrics["gns"]  # computed from all workers' gradients
        if self.prev is not None and gns > self.prev:
            ctx.set_batch_size(int(ctx.batch_size * gns / self.prev) // ctx.size * ctx.size)
        self.prev = gns


class EpochGnsMonitor:
    """Stand-in for GradientMonitor (values(), local_batch_size): gns 100, 100, 300, ... per read.

    The runner reads the monitor only in phases where a policy runs, so with
    an after_epoch policy that is once per epoch (the reads every step that
    this replaced would reach 300 at epoch 1).
    """

    def __init__(self):
        self.local_batch_size = tf.Variable(0, dtype=tf.int64)
        self.calls = 0

    def values(self):
        self.calls += 1
        return {"gns": 100.0 if self.calls <= 2 else 300.0}


def test_readme_policy_with_keras_fit_epoch_hooks():
    import keras

    import kungfu_tf.keras as kfk

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype(np.float32), rng.normal(size=(64, 1)).astype(np.float32)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.1)
    opt.kungfu_monitor = EpochGnsMonitor()
    model.compile(optimizer=opt, loss="mse")
    cb = kfk.PolicyCallback([ListingOne()], batch_size=2, lr_rule="linear", verbose=False)
    ds = adaptive_batch(tf.data.Dataset.from_tensor_slices((x, y)), cb.local_batch_size)
    history = model.fit(ds, epochs=3, steps_per_epoch=2, verbose=0, shuffle=False, callbacks=[cb])
    # Epoch 0 ends at gns 100 (reference), epoch 1 at 100, epoch 2 at 300: x3 after the last epoch.
    assert [d.new for d in cb.runner.history] == [6, pytest.approx(0.3)]
    assert history.history["batch_size"] == [2, 2, 6]
    assert int(opt.kungfu_monitor.local_batch_size.numpy()) == 6
    assert float(opt.learning_rate.numpy()) == pytest.approx(0.3)


class CountingMonitor:
    """Stand-in for GradientMonitor that counts how often the runner reads it."""

    def __init__(self):
        self.local_batch_size = tf.Variable(0, dtype=tf.int64)
        self.calls = 0

    def values(self):
        self.calls += 1
        return {"gns": 100.0}


def test_a_policy_due_every_n_steps_costs_nothing_in_between():
    # GNSBatchSizePolicy(every=3) runs after steps 2, 5, 8: only those steps
    # read the monitor and run an agreement round.
    monitor = CountingMonitor()
    policy = GNSBatchSizePolicy(max_batch_size=64, every=3)
    assert [s for s in range(9) if policy.runs_at("after_step", s, 0)] == [2, 5, 8]
    runner = PolicyRunner([policy], batch_size=4, monitor=monitor, verbose=False)
    rounds = []
    # (before_train's setup round, once, does not count: _started is still False there)
    runner._settle = lambda failure, original=runner._settle: (
        runner._started and rounds.append(runner.hook_step), original(failure))  # fmt: skip
    bodies = 0
    with runner.training():
        for _ in range(9):
            with runner.step():
                bodies += 1  # stands for the training step, which this test is not about
    assert bodies == runner.steps_done == 9
    assert monitor.calls == 3
    assert rounds == [2, 5, 8]


class DoubleAfterStep0(BasePolicy):
    def after_step(self, ctx):
        if ctx.step == 0:
            ctx.set_batch_size(2 * ctx.batch_size)


def test_custom_loop_with_input_signature_traces_once():
    runner = PolicyRunner([DoubleAfterStep0()], batch_size=2, verbose=False)
    ds = adaptive_batch(tf.data.Dataset.range(20), runner.local_batch_size)
    train_step = tf.function(lambda x: tf.shape(x)[0], input_signature=[ds.element_spec])
    rows = []
    with runner.training(), runner.epoch_scope():
        for x in ds.take(3):
            with runner.step():
                rows.append(int(train_step(x)))
    assert rows == [2, 4, 4]
    assert train_step.experimental_get_tracing_count() == 1
    assert (runner.epoch, runner.steps_done, runner.samples) == (1, 3, 10)


def test_loss_scale_optimizer_learning_rate_and_monitor_come_from_the_inner_optimizer():
    # compile() under mixed_float16 wraps the optimizer in a LossScaleOptimizer,
    # whose own learning-rate variable nothing reads.
    import keras

    inner = keras.optimizers.SGD(0.1)
    inner.kungfu_monitor = CountingMonitor()
    wrapped = keras.optimizers.LossScaleOptimizer(inner)
    runner = PolicyRunner([DoubleAfterStep0()], batch_size=2, optimizer=wrapped, lr_rule="linear", verbose=False)
    assert runner.monitor is inner.kungfu_monitor
    with runner.training():
        for _ in range(2):
            with runner.step():
                steps_taken = runner.steps_done + 1
    assert steps_taken == runner.steps_done == 2
    assert float(inner.learning_rate.numpy()) == pytest.approx(0.2)  # what the training step reads
    assert runner.learning_rate == pytest.approx(0.2)
    assert int(inner.kungfu_monitor.local_batch_size.numpy()) == 4


def test_a_learning_rate_schedule_is_fine_until_something_sets_the_learning_rate():
    import keras

    import kungfu_tf.keras as kfk

    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.9)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    x, y = np.zeros((8, 3), np.float32), np.zeros((8, 1), np.float32)
    cb = kfk.PolicyCallback([DoubleAfterStep0()], batch_size=2, verbose=False)  # lr_rule=None
    ds = adaptive_batch(tf.data.Dataset.from_tensor_slices((x, y)).repeat(), cb.local_batch_size)
    model.fit(ds, epochs=1, steps_per_epoch=2, verbose=0, callbacks=[cb])
    assert cb.runner.batch_size == 4 and cb.runner.learning_rate is None
    with pytest.raises(ValueError, match="lr_rule='linear' sets the learning rate, but .*ExponentialDecay"):
        model.fit(ds, epochs=1, steps_per_epoch=1, verbose=0,
                  callbacks=[kfk.PolicyCallback([], batch_size=2, lr_rule="linear", verbose=False)])  # fmt: skip

    class SetsLearningRate(BasePolicy):
        def after_step(self, ctx):
            ctx.set_learning_rate(0.5)

    with pytest.raises(ValueError, match="set_learning_rate: .*ExponentialDecay"):
        model.fit(ds, epochs=1, steps_per_epoch=1, verbose=0,
                  callbacks=[kfk.PolicyCallback([SetsLearningRate()], verbose=False)])  # fmt: skip


class TableMonitor:
    """Stand-in for GradientMonitor: gns = table[step], the step the test says was just run."""

    def __init__(self, table):
        self.local_batch_size = tf.Variable(0, dtype=tf.int64)
        self.table, self.step = table, 0

    def values(self):
        return {"gns": self.table[self.step]}


GNS_PER_STEP = [10.0, 10.0, 16.0, 16.0, 16.0, 30.0, 30.0, 60.0, 60.0, 60.0]


def gns_runner():
    lr = tf.Variable(0.1, dtype=tf.float64)
    monitor, policy = TableMonitor(GNS_PER_STEP), GNSBatchSizePolicy(max_batch_size=64, threshold=1.5, every=1)
    runner = PolicyRunner([policy], batch_size=2, learning_rate=lr, monitor=monitor, lr_rule="linear",
                          min_dwell_steps=3, verbose=False)  # fmt: skip
    return runner, policy, monitor, lr


def train_steps(runner, monitor, steps):
    with runner.training():
        for _ in range(steps):
            with runner.step():
                monitor.step = runner.steps_done  # the step being run


def test_policy_state_checkpointed_a_resumed_run_decides_as_an_uninterrupted_one(tmp_path):
    whole, whole_policy, whole_monitor, whole_lr = gns_runner()
    train_steps(whole, whole_monitor, 10)
    # 16/10 after step 2 -> 3; 30/16 after step 5 -> 5 (lr x5/2); 60/30 after step 7
    # refused (dwell 3), after step 8 -> 10.
    assert [(d.step, d.name, d.new, bool(d.refused)) for d in whole.history if d.name == "batch_size"] == [
        (3, "batch_size", 3, False), (6, "batch_size", 5, False), (8, "batch_size", 10, True),
        (9, "batch_size", 10, False)]  # fmt: skip

    first, _, first_monitor, first_lr = gns_runner()
    train_steps(first, first_monitor, 6)  # stops right after the change at step 5
    path = tf.train.Checkpoint(lr=first_lr, policy=first.state).save(str(tmp_path / "ckpt"))

    resumed, policy, monitor, lr = gns_runner()  # a new process: constructor values
    tf.train.Checkpoint(lr=lr, policy=resumed.state).restore(path).assert_consumed()
    resumed.before_train()
    assert (resumed.batch_size, int(resumed.local_batch_size.numpy()), int(monitor.local_batch_size.numpy())) == (5, 5, 5)
    assert resumed.learning_rate == pytest.approx(0.1 * 5 / 2)
    assert (resumed.steps_done, resumed.samples) == (6, 2 * 3 + 3 * 3)
    assert (policy.reference, policy.state_dict()) == (16.0, {"reference": 16.0, "reference_batch": 3, "requested": [5, 30.0]})
    for _ in range(4):
        with resumed.step():
            monitor.step = resumed.steps_done
    resumed.after_train()
    assert [(d.step, d.name, d.new, d.refused) for d in resumed.history] == [
        (d.step, d.name, d.new, d.refused) for d in whole.history if d.step > 6]
    assert (resumed.batch_size, float(lr.numpy()), policy.reference) == (10, float(whole_lr.numpy()), whole_policy.reference)


def test_runner_refuses_a_monitor_batch_that_is_not_the_global_batch_over_the_workers():
    monitor = CountingMonitor()
    monitor.local_batch_size.assign(32)  # GradientMonitor(batch_size=32): per worker
    runner = PolicyRunner([], batch_size=64, monitor=monitor, verbose=False)  # one worker: 64 per worker
    with pytest.raises(ValueError, match=r"local_batch_size is 32, but the runner's batch_size=64 gives 64 per worker: "
                                         r"batch_size is the \*global\* batch"):  # fmt: skip
        runner.before_train()
    assert int(monitor.local_batch_size.numpy()) == 32  # nothing overridden
    PolicyRunner([], batch_size=32, monitor=monitor, verbose=False).before_train()  # consistent: fine


def test_policy_config_holds_parameters_not_runtime_state():
    from kungfu_tf.policy import AdaptiveTopologyPolicy

    topology = AdaptiveTopologyPolicy(window=4)
    topology.best, topology.adaptations = 99.0, 3
    assert topology.config() == {"candidates": ["RING", "STAR", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE"],
                                 "drop": 0.1, "window": 4, "trial_steps": 5, "settle_steps": 1,
                                 "metric": "throughput", "slow_link": 0.5}  # fmt: skip
    assert AdaptiveTopologyPolicy(window=5).config() != topology.config()
    gns = GNSBatchSizePolicy(64, every=3)
    gns.reference = 12.0
    assert "reference" not in gns.config() and gns.config()["every"] == 3

    class Custom(BasePolicy):
        def __init__(self):
            self.factor, self.name, self.callback, self._private = 2.0, "x", print, 1

    assert Custom().config() == {"factor": 2.0, "name": "x"}  # default: public JSON-able attributes


class TopologyContext(FakeContext):
    """One worker's context for AdaptiveTopologyPolicy: records the topologies it switches to."""

    topology = "RING"

    def all_reduce(self, value, op="mean", name=None):
        return value  # one worker

    def set_topology(self, name, reason=""):
        self.requests.append(name)


def test_adaptive_topology_reacts_by_default_to_the_papers_own_drop():
    """KungFu §6.2 (2): contention took the job from 6.5 to 5.5 images/s (-15 %). The old default drop
    (0.2) never started a trial on it."""
    from kungfu_tf.policy import AdaptiveTopologyPolicy

    policy = AdaptiveTopologyPolicy(candidates=("RING", "STAR"))
    ctx = TopologyContext(batch_size=64, size=1)
    for throughput in [6.5] * policy.window + [5.5] * policy.window:
        ctx.metrics["throughput"] = throughput
        policy.after_step(ctx)
    assert ctx.requests == ["STAR"], ctx.requests


def test_adaptive_topology_forgets_its_reference_when_the_batch_changes_and_rejects_a_list_metric():
    from kungfu_tf.policy import AdaptiveTopologyPolicy

    policy = AdaptiveTopologyPolicy(candidates=("RING", "STAR"), drop=0.2, window=2)
    ctx = TopologyContext(batch_size=64, size=1)
    for throughput in (100.0, 100.0):
        ctx.metrics["throughput"] = throughput
        policy.after_step(ctx)
    assert policy.best == 100.0
    ctx.batch_size = 32  # half the batch: fewer samples/s, no contention
    for throughput in (60.0, 60.0, 60.0, 60.0):
        ctx.metrics["throughput"] = throughput
        policy.after_step(ctx)
    assert ctx.requests == [] and policy.best == 60.0  # no false trial; the new batch's reference

    listed = AdaptiveTopologyPolicy(metric="worker_throughput")
    ctx.metrics["worker_throughput"] = [50.0, 60.0]
    with pytest.raises(ValueError, match="metric 'worker_throughput' must be a scalar .*got list"):
        listed.after_step(ctx)
    with pytest.raises(ValueError, match="metric must be the name of a scalar metric, got None"):
        AdaptiveTopologyPolicy(metric=None)


def test_policy_hook_state_is_saved_and_restored_by_monitored_training_session(tmp_path):
    # v1: the state is graph variables, so the session's Saver carries it with the model.
    from kungfu_tf.v1 import BroadcastGlobalVariablesHook, PolicyHook

    class CountsSteps(BasePolicy):
        def __init__(self):
            self.seen = 0

        def after_step(self, ctx):
            self.seen += 1
            self.peers = (ctx.peers, ctx.self_peer)  # the cluster view works in a v1 session's hooks too

        def config(self):
            return {}

        def state_dict(self):
            return {"seen": self.seen}

        def load_state_dict(self, state):
            self.seen = state["seen"]

    def run(steps):
        with tf.Graph().as_default():
            lr = tf.Variable(0.1, dtype=tf.float32)
            hook = PolicyHook([DoubleAfterStep0(), CountsSteps()], batch_size=2, learning_rate=lr, lr_rule="linear",
                              verbose=False)  # fmt: skip
            step = tf.compat.v1.train.get_or_create_global_step().assign_add(1)
            hooks = [BroadcastGlobalVariablesHook(), hook]  # the broadcast covers the state variables too
            with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=str(tmp_path), hooks=hooks,
                                                             save_checkpoint_steps=1, log_step_count_steps=None) as sess:  # fmt: skip
                lrs = [float(sess.run([step, lr])[1]) for _ in range(steps)]
        return hook, lrs

    first, lrs = run(2)
    assert (first.runner.batch_size, lrs) == (4, [pytest.approx(0.1), pytest.approx(0.2)])
    resumed, lrs = run(1)  # restored: batch 4, lr 0.2, 3 steps; DoubleAfterStep0 does not fire again
    assert (resumed.runner.batch_size, resumed.current_local_batch_size, resumed.runner.steps_done) == (4, 4, 3)
    assert lrs == [pytest.approx(0.2)] and resumed.runner.history == []
    # Saved with step 2: the policy's state from step 1's after_step (written in the next run).
    assert resumed.runner.policies[1].seen == 1 + 1
    me = membership.self_peer()
    assert resumed.runner.policies[1].peers == ((me,), me)


def test_policy_callback_state_in_a_keras_checkpoint(tmp_path):
    import keras

    import kungfu_tf.keras as kfk

    x, y = np.zeros((64, 3), np.float32), np.zeros((64, 1), np.float32)

    def fit(steps, restore=None):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        cb = kfk.PolicyCallback([DoubleAfterStep0()], batch_size=2, lr_rule="linear", verbose=False)
        ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, policy=cb.state)
        if restore:
            ckpt.restore(restore)
        ds = adaptive_batch(tf.data.Dataset.from_tensor_slices((x, y)).repeat(), cb.local_batch_size)
        model.fit(ds, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[cb])
        return cb, model, ckpt.save(str(tmp_path / "ckpt"))

    first, _, path = fit(2)
    assert first.runner.batch_size == 4
    resumed, model, _ = fit(1, restore=path)
    assert (resumed.runner.batch_size, resumed.runner.steps_done, resumed.runner.history) == (4, 3, [])
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.2)


def test_policy_hook_feeds_the_policies_state_again_after_a_failed_run():
    # A run that failed (a lost peer) may or may not have assigned the policies' JSON; MonitoredSession
    # asks the hooks again for the run that replaces it, which must carry it (before: it was dropped, and
    # members could hold different bytes in a synced variable).
    from kungfu_tf.policy.policy_state import COUNTERS
    from kungfu_tf.v1.policy_hook import SessionVariableAccess

    counters = dict.fromkeys(COUNTERS, 0)
    with tf.Graph().as_default():
        state = SessionVariableAccess(2).state
        state.build()
        state.write(counters, '[{"class": "CountsSteps", "state": {"seen": 1}}]')
        assert len(state.run_args(counters).fetches) == 2  # counters and the policies' JSON
        assert len(state.run_args(counters).fetches) == 2  # the run failed: asked again
        state.ran()
        assert len(state.run_args(counters).fetches) == 1  # assigned: the counters only
