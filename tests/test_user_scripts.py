"""Scripts shaped like the Horovod / KungFu TF2 examples users bring (issue 10 §6).

Multi-worker (one launch each, workers in tests/workers/user_*.py, every
result compared with numpy or a one-process reference):

* user_keras_lazy: a ``Sequential`` without ``Input`` + ``fit`` +
  ``BroadcastGlobalVariablesCallback`` + SynchronousSGDOptimizer, ranks
  starting from different weights, equals one process on the union started
  from rank 0's weights (np=1 and 2);
* user_tape_v1: a v1 optimizer wrapped in SynchronousSGDOptimizer, applied
  by tape + ``apply_gradients`` (eager and ``tf.function``, Keras 3
  variables), ``compute_gradients`` + ``apply_gradients`` and ``minimize``:
  every worker ends at numpy's synchronous-SGD weights;
* user_distributed_tape: ``kungfu_tf.DistributedGradientTape`` custom loops
  (sparse ``IndexedSlices`` gathered or densified) equal one process;
* user_two_broadcasts: two unnamed ``broadcast_variables`` in one
  ``tf.function`` and in one v1 graph give root's values; Horovod's loop
  that broadcasts after its first step leaves the workers identical;
* user_lr_warmup: ``LearningRateWarmupCallback`` rates and trained weights
  equal numpy's computation of Horovod's definition (with and without
  momentum correction).

In-process: argument errors of the new and changed APIs.
"""

from __future__ import annotations

import contextlib

import pytest
import tensorflow as tf
from conftest import assert_job_ok, run_job

with contextlib.suppress(RuntimeError):  # already set if another test ran TF first
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

import keras
import numpy as np

import kungfu_tf
import kungfu_tf.optimizers
from kungfu_tf.keras import LearningRateWarmupCallback

# rank -> checks its worker makes (see each worker's docstring).
LAZY_CHECKS = {0: 15, 1: 4}  # rank 0 also compares 10 state arrays with its reference


@pytest.mark.parametrize("np_", [1, 2])
def test_lazy_sequential_fit_with_broadcast_callback(np_):
    rc, out, err = run_job(np_, "user_keras_lazy.py", timeout=240)
    counts = assert_job_ok(rc, out, err, np_)
    assert counts == {r: LAZY_CHECKS[min(r, 1)] for r in range(np_)}, out[-3000:]


def test_tape_and_apply_gradients_with_v1_optimizer_average_once():
    rc, out, err = run_job(2, "user_tape_v1.py", timeout=240)
    assert_job_ok(rc, out, err, 2, expected_checks=10)


def test_distributed_gradient_tape_custom_loop():
    rc, out, err = run_job(2, "user_distributed_tape.py", timeout=240)
    counts = assert_job_ok(rc, out, err, 2)
    assert counts == {0: 24, 1: 6}, out[-3000:]  # rank 0 also compares 2 x 8 arrays with its reference


def test_two_broadcasts_in_one_function():
    rc, out, err = run_job(2, "user_two_broadcasts.py", timeout=240)
    assert_job_ok(rc, out, err, 2, expected_checks=8)


def test_lr_warmup_follows_horovod():
    rc, out, err = run_job(2, "user_lr_warmup.py", timeout=240)
    assert_job_ok(rc, out, err, 2, expected_checks=26)


def test_distributed_gradient_tape_is_exported_where_horovod_users_look():
    assert kungfu_tf.DistributedGradientTape is kungfu_tf.optimizers.DistributedGradientTape
    assert "DistributedGradientTape" in kungfu_tf.__all__


@pytest.mark.parametrize("not_a_tape", [None, "tape", keras.optimizers.SGD(0.1)])
def test_distributed_gradient_tape_rejects_non_tapes(not_a_tape):
    with pytest.raises(TypeError, match="tf.GradientTape"):
        kungfu_tf.DistributedGradientTape(not_a_tape)


def test_distributed_gradient_tape_rejects_wrapping_twice_and_bad_threshold():
    with tf.GradientTape() as tape:
        tape.watch(tf.constant(1.0))  # a real, finished tape
    wrapped = kungfu_tf.DistributedGradientTape(tape)
    with pytest.raises(TypeError, match="once"):
        kungfu_tf.DistributedGradientTape(wrapped)
    with pytest.raises(ValueError, match="fusion_threshold_bytes"):
        kungfu_tf.DistributedGradientTape(tape, fusion_threshold_bytes=-1)


def test_distributed_gradient_tape_delegates_the_rest_of_the_tape():
    v = tf.Variable(3.0)
    with kungfu_tf.DistributedGradientTape(tf.GradientTape(persistent=True)) as tape:
        loss = v * v
    assert [w.ref() for w in tape.watched_variables()] == [v.ref()]
    assert float(tape.gradient(loss, v)) == 6.0  # one worker: unchanged, structure of sources kept


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"initial_lr": 0.0}, "initial_lr"),
        ({"initial_lr": 0.1, "warmup_epochs": 0}, "warmup_epochs"),
        ({"initial_lr": 0.1, "warmup_epochs": 1.5}, "warmup_epochs"),
        ({"initial_lr": 0.1, "steps_per_epoch": 0}, "steps_per_epoch"),
    ],
)
def test_lr_warmup_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LearningRateWarmupCallback(**kwargs)


def test_lr_warmup_needs_steps_per_epoch_when_fit_does_not_know_it():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    unknown_length = tf.data.Dataset.from_tensors((tf.ones([4, 2]), tf.ones([4, 1]))).repeat(2).filter(
        lambda x, y: True
    )
    with pytest.raises(ValueError, match="steps_per_epoch"):
        model.fit(unknown_length, epochs=1, verbose=0, shuffle=False, callbacks=[LearningRateWarmupCallback(0.1)])


@pytest.mark.parametrize("wrapper", ["SynchronousSGDOptimizer", "SynchronousAveragingOptimizer"])
def test_v1_wrappers_take_keras_variables(wrapper):
    var = keras.Variable([1.0, 2.0])
    opt = getattr(kungfu_tf.optimizers, wrapper)(tf.compat.v1.train.MomentumOptimizer(0.5, 0.9))
    opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])  # one worker: a plain momentum step
    assert var.numpy().tolist() == [0.5, 1.5]
    assert opt.get_slot(var, "momentum").numpy().tolist() == [1.0, 1.0]
    (_, unwrapped), = opt.compute_gradients(lambda: tf.reduce_sum(var * var), var_list=[var])
    assert unwrapped is var.value


def test_lr_warmup_warns_where_it_cannot_correct_momentum():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.RMSprop(0.1, momentum=0.5), loss="mse")
    with pytest.warns(UserWarning, match="no momentum correction for RMSprop"):
        model.fit(np.ones((4, 2), np.float32), np.ones((4, 1), np.float32), verbose=0,
                  callbacks=[LearningRateWarmupCallback(0.1, warmup_epochs=1)])
