"""``switch_strategy`` and ``StrategyPolicy`` in one process (a cluster of one): what needs no peers.

The multi-worker behaviour (owners on other ranks, consensus, refusals on every worker) is in
tests/test_strategy_switch.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kungfu_tf
from kungfu_tf.optimizers import SynchronousSGDOptimizer, switch_strategy
from kungfu_tf.policy import StrategyPolicy
from kungfu_tf.policy.strategy_policy import link_change
from kungfu_tf.strategy import builders


def _model() -> keras.Model:
    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dense(3)])


def _train(opt, switches: dict, step_fn=kungfu_tf.elastic.function) -> tuple[list[np.ndarray], object]:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 6)).astype(np.float32), rng.normal(size=(40, 3)).astype(np.float32)
    model = _model()

    @step_fn
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xb) - yb) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    for s in range(8):
        if s in switches:
            switch_strategy(opt, switches[s])
        step(x[s * 5 : (s + 1) * 5], y[s * 5 : (s + 1) * 5])
    return [v.numpy() for v in model.trainable_variables], step


@pytest.mark.parametrize("optimizer", [lambda: keras.optimizers.Adam(0.01), lambda: keras.optimizers.RMSprop(0.01, momentum=0.5)])
def test_slots_follow_every_switch_bit_for_bit(optimizer):
    # Adam makes its slots target by target (momentum, velocity, momentum, ...), RMSprop kind by kind. Read
    # kind by kind (as membership changes read them before), Adam's were refused ("slot ..._velocity has
    # shape (6, 8), its variable .../bias (8,)"), or, where shapes agree, a velocity moved into a momentum.
    reference, _ = _train(optimizer(), {})
    switches = {2: "AllReduce", 4: builders.PartitionedPS(min_partition_bytes=16), 6: "AllReduce"}
    got, step = _train(SynchronousSGDOptimizer(optimizer(), strategy="PS"), switches)
    for g, r in zip(got, reference):
        np.testing.assert_array_equal(g, r)
    assert step.traces == 4


def test_a_switch_to_the_strategy_in_force_changes_nothing():
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), strategy="AllReduce")
    opt.build(_model().trainable_variables)
    plan = opt._kungfu_plan
    report = switch_strategy(opt, builders.AllReduce())
    assert not report.changed and opt._kungfu_plan is plan and report.gather_seconds == 0


def test_a_plain_tf_function_refuses_the_old_plan_and_keras_fit_traces_again():
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), strategy="PS")
    with pytest.raises(tf.errors.InvalidArgumentError, match="before a membership change or a strategy switch"):
        _train(opt, {3: "AllReduce"}, step_fn=tf.function)

    class SwitchAtBatch2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                switch_strategy(self.model.optimizer, "AllReduce", model=self.model)

    model = _model()
    model.compile(optimizer=SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="PS"), loss="mse")
    model.fit(np.ones([20, 6]), np.zeros([20, 3]), batch_size=4, verbose=0, callbacks=[SwitchAtBatch2()])
    assert model.optimizer._kungfu_plan.strategy.id == "AllReduce"


def test_switch_refuses_what_it_cannot_switch():
    with pytest.raises(TypeError, match="wrapped by SynchronousSGDOptimizer"):
        switch_strategy(keras.optimizers.SGD(0.1), "AllReduce")
    with pytest.raises(TypeError, match="without a strategy"):
        switch_strategy(SynchronousSGDOptimizer(keras.optimizers.SGD(0.1)), "AllReduce")
    with pytest.raises(ValueError, match="not built"):
        switch_strategy(SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="PS"), "AllReduce")


def test_strategy_policy_checks_its_arguments():
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="PS")
    with pytest.raises(TypeError, match="StrategyPolicy: optimizer must be"):
        StrategyPolicy(keras.optimizers.SGD(0.1), ["AllReduce"])
    with pytest.raises(ValueError, match="non-empty list"):
        StrategyPolicy(opt, "AllReduce")
    with pytest.raises(Exception, match="neither a file nor a builder name"):
        StrategyPolicy(opt, ["AllReduce", "NoSuchBuilder"])
    with pytest.raises(ValueError, match="min_gain"):
        StrategyPolicy(opt, ["AllReduce"], min_gain=1.0)


def test_link_change_is_the_largest_relative_move_of_a_measured_link():
    ref = np.array([[0.0, 100.0, 50.0], [100.0, 0.0, 0.0], [50.0, 0.0, 0.0]])
    now = np.array([[0.0, 90.0, 10.0], [90.0, 0.0, 7.0], [10.0, 7.0, 0.0]])
    assert link_change(ref, now) == pytest.approx(0.8)  # 50 -> 10; the unmeasured link 1-2 does not count


def test_link_change_leaves_out_nearly_idle_links():
    # As in the throttle benchmark (benchmarks/strategy_policy): under PSLoadBalancing a worker sends tens of MB/s
    # to the owners of the kernels and a few KB/s or nothing to another; such a link's relative moves (92-98 %
    # there) re-scored a job whose links had not changed. A busy link moving 90 % still counts.
    ref = np.array([[0.0, 75e6, 0.05e6], [75e6, 0.0, 40e6], [0.05e6, 40e6, 0.0]])
    steady = np.array([[0.0, 70e6, 0.005e6], [70e6, 0.0, 42e6], [0.005e6, 42e6, 0.0]])
    assert link_change(ref, steady) == pytest.approx(5 / 75)
    throttled = steady.copy()
    throttled[0, 1] = throttled[1, 0] = 7.5e6
    assert link_change(ref, throttled) == pytest.approx(0.9)
    # At 1 % of the busiest link a link counts.
    ref[0, 2] = 0.75e6
    assert link_change(ref, steady) == pytest.approx(1 - 0.005 / 0.75)


class ProbeContext:
    """One worker's context for StrategyPolicy._probing: records the agreements and the log."""

    def __init__(self):
        self.reduces, self.lines = [], []

    def all_reduce(self, value, op="mean", name=None, topology=None):
        self.reduces.append((value, op, name, topology))
        return value  # one worker

    def log(self, line):
        self.lines.append(line)


def probing_policy(counts, max_wait):
    policy = StrategyPolicy(SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="PS"), ["AllReduce"],
                            max_probe_wait_steps=max_wait)  # fmt: skip
    reads = iter(counts)
    policy._probe_samples = lambda: next(reads)
    policy._probe_wait, policy._samples_seen = max_wait, None  # as _next_trial leaves them
    return policy


def test_a_trial_times_no_step_while_auto_is_still_probing():
    # AUTO's probe samples (ops.auto_probe_samples) after each trial step: 5 (the first read), 7 and 9 (still
    # measuring), 9 (a step without samples: timed, and so is every later step, without reading again).
    policy, ctx = probing_policy([5, 7, 9, 9], max_wait=20), ProbeContext()
    assert [policy._probing(ctx) for _ in range(6)] == [True, True, True, False, False, False]
    # Agreed on a fixed topology (AUTO would probe the agreement's own class), "any worker saw samples".
    assert ctx.reduces == [(1.0, "max", "kungfu_policy/strategy_trial_probing", "STAR")] * 2 + [
        (0.0, "max", "kungfu_policy/strategy_trial_probing", "STAR")]  # fmt: skip
    assert ctx.lines == []


def test_a_trial_stops_waiting_for_a_probe_after_max_probe_wait_steps():
    policy, ctx = probing_policy(range(0, 100, 2), max_wait=3), ProbeContext()
    assert [policy._probing(ctx) for _ in range(6)] == [True, True, True, True, False, False]
    assert ctx.lines == ["strategy trial: AUTO still measured after 3 steps; timing anyway"]
    off, ctx = probing_policy([], max_wait=0), ProbeContext()  # 0: no wait, the count is never read
    assert not off._probing(ctx) and ctx.reduces == []
    with pytest.raises(ValueError, match="max_probe_wait_steps"):
        StrategyPolicy(SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy="PS"), ["AllReduce"],
                       max_probe_wait_steps=-1)  # fmt: skip
