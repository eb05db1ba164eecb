"""ElasticCallback / elastic_fit in one process, with a scripted stand-in for the elastic state: fit
stopped by membership changes (mid-epoch, at an epoch's last step) and re-entered trains exactly what one
uninterrupted pass over the sampler's order trains (bitwise-equal weights), with the right epoch and step,
and without tracing the train function again. Multi-worker runs (a real resize and a crash) are in
tests/test_elastic_keras.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.data import ElasticSampler
from kungfu_tf.keras import ElasticCallback, elastic_fit

SAMPLES, BATCH, EPOCHS = 40, 4, 3  # 10 steps per epoch


class ScriptedState:
    """The part of ElasticState the callback uses; ``check()`` reports a change after the scripted steps."""

    def __init__(self, changes_at=(), detach_at=None):
        self.step, self.epoch = 0, 0
        self.changes_at, self.detach_at = set(changes_at), detach_at
        self.detached = False
        self.last_change = None  # what ElasticState.last_change is: the last change applied, by anyone

    def commit(self):
        self.step += 1

    def check(self):
        if self.step == self.detach_at:
            self.detached = True
            self.last_change = SimpleNamespace(detached=True)
            return self.last_change
        if self.step in self.changes_at:
            self.last_change = SimpleNamespace(detached=False, step=self.step)
            return self.last_change
        return None


class ResizeAfterStep(keras.callbacks.Callback):
    """Stands for a callback (a policy) that resizes after the given steps were committed."""

    def __init__(self, state, steps):
        super().__init__()
        self.state, self.steps, self.seen_steps = state, set(steps), []

    def on_train_batch_end(self, batch, logs=None):
        self.seen_steps.append(self.state.step)
        if self.state.step in self.steps:
            self.state.last_change = SimpleNamespace(detached=False, step=self.state.step)


class CountingModel(keras.Model):
    """Counts how often Keras traces train_step (Python runs only while tracing)."""

    traces = 0

    def train_step(self, data):
        CountingModel.traces += 1
        return super().train_step(data)


def build_model():
    keras.utils.set_random_seed(7)
    inputs = keras.Input((6,))
    outputs = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs))
    model = CountingModel(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(SAMPLES, 6)).astype(np.float32), rng.integers(0, 3, SAMPLES).astype(np.int32)


def reference_weights():
    """One plain fit over every epoch's batches in the sampler's order (an independent reference)."""
    x, y = data()
    sampler = ElasticSampler(SAMPLES, BATCH, seed=3)
    order = np.concatenate([sampler.order(e) for e in range(EPOCHS)])
    model = build_model()
    ds = tf.data.Dataset.from_tensor_slices((x[order], y[order])).batch(BATCH)
    model.fit(ds, epochs=1, verbose=0, shuffle=False)
    return model.get_weights()


@pytest.mark.parametrize(("changes_at", "resized_at"), [((3, 10, 17), ()), ((), ()), ((), (3, 10, 17))])
def test_fit_stopped_by_changes_resumes_with_the_right_epoch_and_data_without_retracing(changes_at, resized_at):
    x, y = data()
    sampler = ElasticSampler(SAMPLES, BATCH, seed=3)
    state = ScriptedState(changes_at)
    model = build_model()
    CountingModel.traces = 0
    epochs_seen, traces_after_fit, stopped_at = [], [], []
    log = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs_seen.append(epoch),
                                         on_train_end=lambda logs: (traces_after_fit.append(CountingModel.traces),
                                                                    stopped_at.append(state.step)))  # fmt: skip
    resizer = ResizeAfterStep(state, resized_at)
    elastic_fit(model, state, sampler, (x, y), epochs=EPOCHS, callbacks=[log, resizer], verbose=0)
    assert (state.step, state.epoch, sampler.epoch, sampler.offset) == (EPOCHS * 10, EPOCHS, EPOCHS, 0)
    assert resizer.seen_steps == list(range(1, EPOCHS * 10 + 1))  # other callbacks see each step committed
    # The first fit traces (twice: tf.function traces again when the first trace created the
    # optimizer's variables); the fits after it trace nothing.
    changes = changes_at or resized_at
    assert len(traces_after_fit) == (5 if changes else 1) and len(set(traces_after_fit)) == 1
    for got, want in zip(model.get_weights(), reference_weights()):
        np.testing.assert_array_equal(got, want)
    assert int(model.optimizer.iterations.numpy()) == state.step  # no step counted twice
    if changes:
        # step 3: epoch 0 resumed; after that fit's first (partial) epoch it stops again so the next
        # one counts a whole epoch; 10: the change at epoch 0's last step; 17: epoch 1 resumed.
        assert epochs_seen == [0, 0, 1, 1, 2]
        assert stopped_at == [3, 10, 17, 20, 30]  # right after each change (the watcher: also a callback's)


def test_a_detached_worker_stops_and_returns():
    x, y = data()
    sampler = ElasticSampler(SAMPLES, BATCH, seed=3)
    state = ScriptedState(detach_at=5)
    assert elastic_fit(build_model(), state, sampler, (x, y), epochs=EPOCHS, verbose=0) is None
    assert (state.step, state.epoch, sampler.offset) == (5, 0, 5 * BATCH)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="check_every must be a positive int, got 0"):
        ElasticCallback(ScriptedState(), check_every=0)
    x, y = data()
    state, sampler = ScriptedState(), ElasticSampler(SAMPLES, BATCH)
    state.epoch = 1
    model = build_model()
    with pytest.raises(ValueError, match="fit is at epoch 0 but state.epoch is 1; pass initial_epoch=state.epoch"):
        model.fit(sampler.dataset((x, y), 0, 1), epochs=2, callbacks=[ElasticCallback(state, sampler)], verbose=0)
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    with pytest.raises(ValueError, match="steps_per_execution=2; elastic training commits every step"):
        model.fit(sampler.dataset((x, y), 0, 1), epochs=1, callbacks=[ElasticCallback(state, sampler)], verbose=0)
