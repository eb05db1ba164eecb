"""The re-run mode's states and Keras callbacks in one process (no launcher: a one-worker job, no changes).

Multi-process runs with crashes and joiners: tests/test_elastic_rerun.py.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import kungfu_tf as hvd
from kungfu_tf.data import ElasticSampler


def _model() -> keras.Model:
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def _arrays(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in [*model.variables, *model.optimizer.variables]]


def test_restore_rolls_model_optimizer_values_and_sampler_back_to_the_commit():
    model = _model()
    sampler = ElasticSampler(12, batch_size=2, seed=1)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0, counter=[0], sampler=sampler)
    x, y = np.ones([8, 4], np.float32), np.zeros([8, 2], np.float32)
    model.fit(x, y, epochs=1, verbose=0)  # slots move (Adam) after the state built them
    state.batch, state.counter = 4, [1]
    sampler.next_indices(0, 1)
    sampler.commit(1)
    state.commit()
    committed = _arrays(model)
    model.fit(x, y, epochs=2, verbose=0)
    state.batch, state.epoch = 7, 3
    state.counter.append(2)
    sampler.next_indices(0, 1)
    sampler.commit(1)
    assert not all(np.array_equal(a, b) for a, b in zip(committed, _arrays(model)))
    state.restore()
    for got, want in zip(_arrays(model), committed):
        np.testing.assert_array_equal(got, want)
    assert (state.batch, state.epoch, state.counter, sampler.offset) == (4, 0, [1], 2)
    state.counter.append(5)  # the saved copy is not the live list
    state.restore()
    assert state.counter == [1]


def test_object_and_tensorflow_state_accept_horovods_signature():
    v = tf.Variable([1.0, 2.0])
    state = hvd.elastic.TensorFlowState([v], session=None, step=0)
    v.assign([5.0, 6.0])
    state.step = 9
    state.restore()
    assert v.numpy().tolist() == [1.0, 2.0] and state.step == 0
    obj = hvd.elastic.ObjectState(bcast_object=None, get_rank=None, x=1)
    obj.x = 2
    obj.commit()  # not elastic: no change, no interrupt
    obj.x = 3
    obj.restore()
    assert obj.x == 2
    with pytest.raises(ValueError, match="reserved"):
        hvd.elastic.ObjectState(model=1)
    with pytest.raises(ValueError, match="optimizer"):
        hvd.elastic.KerasState(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))


def test_run_needs_a_state():
    with pytest.raises(TypeError, match="ObjectState"):
        hvd.elastic.run(lambda s: None)(object())


class _Count(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[int, int]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append((self.epoch, batch))

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


@pytest.mark.parametrize("style", ["epochs_left", "initial_epoch"])
def test_a_fit_entered_mid_epoch_finishes_that_epoch_then_run_enters_it_again(style):
    """state.batch = 3 of 5: the first fit trains 2 batches, ends the epoch and run() calls train again for the
    remaining epochs (Keras 3 cannot shorten one epoch of a fit); epochs counted over both fits."""
    model = _model()
    state = hvd.elastic.KerasState(model, batch=3, epoch=1)
    count = _Count()
    commits = []
    state.commit = lambda original=state.commit: (commits.append((state.epoch, state.batch)), original())[1]
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2), count]  # fmt: skip
    data = tf.data.Dataset.from_tensor_slices((np.ones([4, 4], np.float32), np.zeros([4, 2], np.float32))).repeat().batch(2)
    entries = []

    @hvd.elastic.run
    def train(state):
        entries.append((state.epoch, state.batch))
        if style == "epochs_left":
            state.model.fit(data, steps_per_epoch=5, epochs=3 - state.epoch, callbacks=callbacks, verbose=0)
        else:
            state.model.fit(data, steps_per_epoch=5, epochs=3, initial_epoch=state.epoch, callbacks=callbacks, verbose=0)
        return "done"

    assert train(state) == "done"
    assert entries == [(1, 3), (2, 0)]
    assert len(count.batches) == 2 + 5
    assert (state.epoch, state.batch) == (3, 0)
    # every 2 batches and at each epoch's end (the partial epoch's too)
    assert commits == [(1, 5), (2, 0), (2, 2), (2, 4), (3, 0)], commits
    assert int(model.optimizer.iterations.numpy()) == 7


def test_commit_state_callback_checks_its_argument():
    with pytest.raises(ValueError, match="batches_per_commit"):
        hvd.elastic.CommitStateCallback(hvd.elastic.ObjectState(batch=0), batches_per_commit=0)
