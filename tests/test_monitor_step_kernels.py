"""The gradient monitor's two fused kernels per step (ops/kernels/monitor_step_kernels.cc, issue 23 §4).

Before, monitoring a step added ~50 executed ops (variable reads and assigns, slices,
casts, a one-hot; ~95 with the one-worker cond): a fixed ~0.09 ms per step. Now the
work before the all-reduce is one kernel (KungfuMonitorLocal) and everything after it
one kernel that writes the monitor's variables (KungfuMonitorUpdate). Checked here:
the op count of a traced step (fails before: 50 and 96 extra ops), the kernels'
values against the per-statistic ops and numpy (bit for bit: same arithmetic), the
copy-on-write of the variables they write, and the errors for bad input. The whole
monitor against a numpy replay at np 1, 2 and 4 is tests/test_gradient_monitor.py.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import tensorflow as tf

with contextlib.suppress(RuntimeError):  # already set if another test ran TF first
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

import keras

import kungfu_tf
from kungfu_tf.ops import monitor as monitor_ops
from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer


def _executed_ops(graph: tf.Graph) -> list[str]:
    """Op types of a traced function and of the functions it calls (cond branches), without its inputs."""
    types = [op.type for op in graph.get_operations() if op.type != "Placeholder"]
    for f in graph._functions.values():
        if hasattr(f, "graph"):
            types += _executed_ops(f.graph)
    return types


def _traced_step_ops(monitor: GradientMonitor | None) -> list[str]:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), monitor=monitor)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return _executed_ops(step.get_concrete_function(tf.TensorSpec([2, 8])).graph)


@pytest.mark.parametrize("traced_size", [1, 2])
def test_monitoring_adds_a_handful_of_ops_per_step(traced_size, monkeypatch):
    """GNS + compute times: the clock, two kernels and the rider's barrier; not ~50-95 small ops.

    traced_size 1 is a step traced at one worker (the previous-gradient pairing), 2 one
    traced for a cluster (no copy). Counts graph ops, not time: the speed is
    `make bench-monitoring`'s.
    """
    monkeypatch.setattr(kungfu_tf, "size", lambda: traced_size)
    plain = _traced_step_ops(None)
    monitored = _traced_step_ops(GradientMonitor(batch_size=2))
    extra = len(monitored) - len(plain)
    assert extra <= 4, (extra, sorted(monitored))
    assert monitored.count("KungfuMonitorLocal") == 1 and monitored.count("KungfuMonitorUpdate") == 1
    for op_type in ("AssignVariableOp", "ReadVariableOp", "If", "StatelessIf", "Cast"):
        assert monitored.count(op_type) == plain.count(op_type), op_type


def _traced_step_captures(monitor: GradientMonitor | None) -> int:
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)])
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), monitor=monitor)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return len(step.get_concrete_function(tf.TensorSpec([2, 8])).captured_inputs)


def test_monitoring_adds_two_captured_inputs_per_step(monkeypatch):
    """Every captured variable is one more input each call of the step passes in Python.

    Eleven monitor variables captured one by one were most of the GNS
    monitor's cost on the digits MLP's 0.7 ms steps; their handles now travel
    packed in one tensor, beside the step clock's anchor. Counts inputs, not
    time (fails before: 12 extra captures). A step traced for a cluster: one
    traced alone also captures the one-worker pairing's gradient copies.
    """
    monkeypatch.setattr(kungfu_tf, "size", lambda: 2)
    extra = _traced_step_captures(GradientMonitor(batch_size=2)) - _traced_step_captures(None)
    assert extra <= 2, extra


def test_packed_state_handles_write_the_same_variables():
    """update_monitor given variable_handles(state) writes those variables, as with the list, in a traced
    step too, where a read of one of them after the update sees the update (fails without the resolver
    in ops/monitor.py: NaN, the value before)."""
    rider, seconds = tf.constant([4.0, 0.25, 0.75], tf.float64), tf.constant(0.25, tf.float64)
    by_list, packed = _state(gns=True), _state(gns=True)
    averaged = [tf.constant([1.0, 2.0])]
    monitor_ops.update_monitor(rider, seconds, tf.constant(2), averaged, [], by_list, [], True, 0.5)
    handles = monitor_ops.variable_handles(packed)
    @tf.function
    def step():
        # The rider arrives late (after a matmul), as after an all-reduce: unordered, the read would run first.
        slow = tf.reduce_sum(tf.matmul(tf.ones([300, 300]), tf.ones([300, 300])))
        late_rider = rider + tf.cast(slow, tf.float64) * 0.0
        monitor_ops.update_monitor(late_rider, seconds, tf.constant(2), averaged, [], handles, [], True, 0.5)
        return packed[9].read_value()  # inside the step, after the update

    read_in_step = step()
    for a, b in zip(by_list, packed):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(packed[2].numpy()) == 1 and np.isfinite(float(packed[9].numpy()))
    assert float(read_in_step) == float(packed[9].numpy())  # ordered after the update, though it took one tensor
    with pytest.raises(ValueError, match="state must hold 11 variables with gns, got 3"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(2), [], [], monitor_ops.variable_handles(packed[:3]),
                                   [], True, 0.5)  # fmt: skip


def _state(gns: bool, batch_size: int = 8) -> list[tf.Variable]:
    f64 = lambda v: tf.Variable(v, dtype=tf.float64)
    state = [f64(np.nan), tf.Variable([np.nan], dtype=tf.float64, shape=[None]), tf.Variable(0, dtype=tf.int64)]
    if gns:
        state += [tf.Variable(batch_size, dtype=tf.int64), f64(0.0), f64(0.0), tf.Variable(0, dtype=tf.int64)]
        state += [f64(np.nan) for _ in range(4)]
    return state


def test_local_statistics_lays_out_the_rider_like_the_separate_ops():
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.standard_normal((5, 3)), tf.float32), tf.constant(rng.standard_normal(7), tf.float64)]
    start = monitor_ops.step_clock_start(tf.Variable(0))
    rider, seconds, size = monitor_ops.local_statistics(start, grads, with_norm=True)
    assert int(size) == 1 and rider.shape == [2]
    assert float(rider[0]) == float(monitor_ops.squared_norm(grads))  # same arithmetic, same bits
    assert float(rider[1]) == float(seconds) >= 0.0
    rider, _, _ = monitor_ops.local_statistics(start, grads, with_norm=False)
    assert float(rider[0]) == 0.0


def test_a_float32_rider_has_the_bits_of_the_float64_one_cast():
    """The rider is made in the all-reduce's dtype (no Cast op before or after it): the same values as the cast."""
    rng = np.random.default_rng(4)
    grads = [tf.constant(rng.standard_normal((6, 5)), tf.float32)]
    start = tf.constant(0, tf.int64)
    wide, _, _ = monitor_ops.local_statistics(start, grads, with_norm=True, rider_dtype=tf.float64)
    narrow, _, _ = monitor_ops.local_statistics(start, grads, with_norm=True, rider_dtype=tf.float32)
    assert narrow.dtype == tf.float32 and narrow.numpy()[0] == tf.cast(wide, tf.float32).numpy()[0]
    state32, state64 = _state(gns=True), _state(gns=True)
    for state, rider in ((state32, narrow), (state64, tf.cast(narrow, tf.float64))):
        monitor_ops.update_monitor(rider, tf.constant(0.0, tf.float64), tf.constant(1), grads, [], state, [], True, 0.5)
    for a, b in zip(state32, state64):
        np.testing.assert_array_equal(a.numpy(), b.numpy())  # NaN where both are NaN
    with pytest.raises(TypeError, match="rider_dtype must be float32 or float64, got float16"):
        monitor_ops.local_statistics(start, grads, with_norm=True, rider_dtype=tf.float16)


def test_update_writes_what_gns_update_computes():
    """Several workers' arithmetic (size 3 in the rider): the EMA state and estimates equal KungfuGnsUpdate's bits."""
    rng = np.random.default_rng(1)
    averaged = [tf.constant(rng.standard_normal((4, 4)), tf.float32), tf.constant(rng.standard_normal(4), tf.float32)]
    state = _state(gns=True, batch_size=8)
    ema = (tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64), tf.constant(0, tf.int64))
    size = 3
    for step in range(4):
        mean_local_sq = float(monitor_ops.squared_norm(averaged)) * (1.5 + step)
        rider = tf.constant([mean_local_sq, 0.1, 0.2, 0.3 + step], tf.float64)
        monitor_ops.update_monitor(rider, tf.constant(0.25, tf.float64), tf.constant(size), averaged, [], state, [],
                                   gns=True, smoothing=0.9)  # fmt: skip
        f64 = [tf.constant(v, tf.float64) for v in (mean_local_sq, 8.0, 8.0 * size)]
        want = monitor_ops.gns_update(f64[0], monitor_ops.squared_norm(averaged), f64[1], f64[2], True, *ema,
                                      smoothing=0.9)  # fmt: skip
        ema = (want["ema_noise_trace"], want["ema_grad_sq_norm"], want["ema_count"])
        got = dict(zip(("ema_noise_trace", "ema_grad_sq_norm", "ema_count"), (v.numpy() for v in state[4:7])))
        got.update(zip(("noise_trace", "grad_sq_norm", "gns", "gns_raw"), (v.numpy() for v in state[7:])))
        for key, value in got.items():
            assert value == want[key].numpy(), (step, key, value, want[key].numpy())
        assert float(state[0].numpy()) == 0.25
        np.testing.assert_array_equal(state[1].numpy(), rider.numpy()[1:] * size)
        assert int(state[2].numpy()) == step + 1


def test_update_pairs_one_worker_gradients_and_keeps_a_copy():
    """A cluster of one: pairs with the previous copies (pair_squared_norms' bits), then holds this step's copy."""
    rng = np.random.default_rng(2)
    state = _state(gns=True, batch_size=4)
    previous = [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([5])), tf.Variable(0, dtype=tf.int64)]
    steps = [[tf.constant(rng.standard_normal(s), tf.float32) for s in ((3, 2), (5,))] for _ in range(3)]
    rider = tf.constant([0.0, 0.0], tf.float64)
    for i, current in enumerate(steps):
        held = [v.read_value() for v in previous[:2]]
        monitor_ops.update_monitor(rider, tf.constant(0.0, tf.float64), tf.constant(1), current, current, state,
                                   previous, gns=True, smoothing=0.0)  # fmt: skip
        for v, g in zip(previous[:2], current):
            np.testing.assert_array_equal(v.numpy(), g.numpy())  # the copy is this step's gradient
        assert int(previous[2].numpy()) == 4
        if i == 0:  # no pair yet (batch size 0 held)
            assert np.isnan(state[10].numpy()) and int(state[6].numpy()) == 0
            continue
        norms = monitor_ops.pair_squared_norms(current, held).numpy()
        grad_sq, trace = monitor_ops.gns_estimates(0.5 * (norms[0] + norms[1]), norms[2], 4.0, 8.0)
        assert float(state[8].numpy()) == float(grad_sq) and float(state[7].numpy()) == float(trace)
        assert int(state[6].numpy()) == i


def test_several_workers_forget_the_one_worker_copy():
    state = _state(gns=True, batch_size=4)
    previous = [tf.Variable(tf.ones([2])), tf.Variable(4, dtype=tf.int64)]
    g = [tf.constant([1.0, 2.0])]
    monitor_ops.update_monitor(tf.constant([5.0, 0.0, 0.0], tf.float64), tf.constant(0.0, tf.float64), tf.constant(2),
                               g, g, state, previous, gns=True, smoothing=0.0)  # fmt: skip
    assert int(previous[1].numpy()) == 0  # the next one-worker step has no pair
    # small = 5 (B = 4), big = |g|^2 = 5 (B = 8): tr(Sigma) = 0.
    assert float(state[7].numpy()) == 0.0 and float(state[8].numpy()) == 5.0


def test_a_value_read_before_the_update_does_not_change():
    """Copy-on-write, as AssignVariableOp: a tensor that still holds the old value keeps it."""
    state = _state(gns=False)
    state[0].assign(1.5)
    before = state[0].value()  # shares the variable's buffer
    monitor_ops.update_monitor(tf.constant([0.0, 2.0], tf.float64), tf.constant(2.0, tf.float64), tf.constant(1), [],
                               [], state, [], gns=False, smoothing=0.9)  # fmt: skip
    assert float(before) == 1.5 and float(state[0].numpy()) == 2.0
    monitor_ops.update_monitor(tf.constant([0.0, 3.0], tf.float64), tf.constant(3.0, tf.float64), tf.constant(1), [],
                               [], state, [], gns=False, smoothing=0.9)  # fmt: skip
    assert float(state[0].numpy()) == 3.0 and int(state[2].numpy()) == 2


def test_bad_input_is_refused_with_the_cause_named():
    rider, seconds = tf.constant([0.0, 1.0], tf.float64), tf.constant(1.0, tf.float64)
    with pytest.raises(ValueError, match="state must hold 11 variables with gns, got 3"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(1), [], [], _state(gns=False), [], True, 0.9)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"'reduced_rider' must be a vector of 1 \+ size = 3"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(2), [], [], _state(gns=False), [], False, 0.9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="input 'size' must be >= 1, got 0"):
        monitor_ops.update_monitor(rider[:1], seconds, tf.constant(0), [], [], _state(gns=False), [], False, 0.9)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"attr 'smoothing' must be in \[0, 1\)"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(1), [], [], _state(gns=False), [], False, 1.5)
    with pytest.raises(ValueError, match="1 current gradients need 2 previous variables"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(1), [], [tf.ones([2])], _state(gns=True),
                                   [tf.Variable(tf.ones([2]))], True, 0.9)  # fmt: skip
    wrong_shape = [tf.Variable(tf.ones([3])), tf.Variable(0, dtype=tf.int64)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"current gradient 0 is float\[2\] but its previous"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(1), [], [tf.ones([2])], _state(gns=True), wrong_shape,
                                   True, 0.9)  # fmt: skip
    bad_state = _state(gns=True)
    bad_state[3] = tf.Variable(8.0, dtype=tf.float64)  # local_batch_size must be int64
    with pytest.raises(tf.errors.InvalidArgumentError, match="variable 'local_batch_size': must be a int64 scalar"):
        monitor_ops.update_monitor(rider, seconds, tf.constant(1), [], [], bad_state, [], True, 0.9)
    with pytest.raises(TypeError, match="local_statistics: tensor 0 must be float16, bfloat16, float32 or float64"):
        monitor_ops.local_statistics(tf.constant(0, tf.int64), [tf.ones([2], tf.int32)], True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="'start_ns' must be a scalar"):
        monitor_ops.local_statistics(tf.constant([0, 1], tf.int64), [], True)


def test_sparse_gradients_are_monitored_as_their_dense_sum():
    """tf.IndexedSlices (an embedding's gradient, a row twice) at one worker: the pairing densifies them inside
    the step (a tf.cond on the size), the norm sums duplicate rows first; the values equal those of the same
    gradients given dense, up to the order of the float64 sums."""
    rows = [([0, 2, 0], [[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]]), ([1, 1, 3], [[2.0, 1.0], [-1.0, 1.0], [0.0, 4.0]]),
            ([3, 0, 2], [[1.0, 1.0], [2.0, -2.0], [0.5, 0.5]])]  # fmt: skip

    def monitored(sparse: bool) -> dict:
        monitor = GradientMonitor(batch_size=2, smoothing=0.5)
        opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0), monitor=monitor)
        table = keras.Variable(tf.zeros([4, 2]))
        opt.build([table])

        @tf.function
        def step(indices, values):
            g = tf.IndexedSlices(values, indices, tf.constant([4, 2]))
            opt.apply_gradients([(g if sparse else tf.convert_to_tensor(g), table)])

        for indices, values in rows:
            step(tf.constant(indices), tf.constant(values))
        return monitor.values()

    results = [monitored(sparse=True), monitored(sparse=False)]
    sparse_values, dense_values = results
    assert sparse_values["monitor_step"] == dense_values["monitor_step"] == 3
    dense_rows = []
    for indices, values in rows:
        d = np.zeros([4, 2])
        np.add.at(d, indices, values)
        dense_rows.append(d.ravel())
    # Two pairs (steps 2 and 3) of batches of 2, smoothing 0.5, against numpy.
    ema_trace = ema_grad = 0.0
    for previous, g in itertools.pairwise(dense_rows):
        mean = 0.5 * (g + previous)
        small, big = 0.5 * (g @ g + previous @ previous), mean @ mean
        ema_grad = 0.5 * ema_grad + 0.5 * (4 * big - 2 * small) / 2
        ema_trace = 0.5 * ema_trace + 0.5 * (small - big) / (1 / 2 - 1 / 4)
    correction = 1 - 0.5**2
    for values in (sparse_values, dense_values):
        assert values["noise_trace"] == pytest.approx(ema_trace / correction, rel=1e-12)
        assert values["grad_sq_norm"] == pytest.approx(ema_grad / correction, rel=1e-12)
