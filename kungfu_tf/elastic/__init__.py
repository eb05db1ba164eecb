"""Elastic training: change the set of workers while training runs, and survive crashed ones.

Start the job with ``kungfu-run --elastic [--min-np A] [--max-np B] -np N``.

* :class:`ElasticState` holds what every worker must agree on (variables,
  step, epoch, data position, policy state); ``check()`` at step boundaries
  applies membership changes, ``sync()`` makes the state identical.
* :func:`run` wraps a training function: joiners join, crashed peers are
  reported and the function resumes on the survivors. Two modes, chosen by
  the state: with an :class:`ElasticState` a change is applied in place at
  ``check()`` and the loop goes on (KungFu); with an :class:`ObjectState`,
  :class:`TensorFlowState` or :class:`TensorFlowKerasState` (= ``KerasState``)
  the function is entered again from the last commit after every change and
  a lost peer rolls every value back to it (Horovod; kungfu_tf/elastic/rerun.py).
  Horovod's Keras callbacks (``CommitStateCallback``,
  ``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``) are here too.
* :func:`resize` (``kungfu_tf.ops.resize``) shrinks, evicts or grows the job.
* :func:`function`: a ``tf.function`` for the step, traced again after a
  membership change re-built the optimizer's strategy (its owners, shards, slots).
* :func:`is_joiner`, :func:`detached` (KungFu's name: this worker left the job), :func:`model_signature`.

Example (``kungfu-run --elastic -np 3 python train.py``)::

    import kungfu_tf.elastic as elastic

    state = elastic.ElasticState(model=model, optimizer=optimizer)

    @elastic.run
    def train(state):
        while state.step < 300:
            state.check()                      # joiners admitted, crashes
            train_step(next_batch())
            state.commit()
            if state.step == 100:
                elastic.resize(2)              # the third worker leaves

    train(state)
"""

from typing import Any

from kungfu_tf.elastic.errors import (
    ElasticError,
    JobEndedError,
    JoinerRejectedError,
    StateMismatchError,
)
from kungfu_tf.elastic.object_state import (
    KerasState,
    ObjectState,
    TensorFlowKerasState,
    TensorFlowState,
)
from kungfu_tf.elastic.rerun import HostsUpdatedInterrupt
from kungfu_tf.elastic.runner import recover, run
from kungfu_tf.elastic.signature import model_signature
from kungfu_tf.elastic.state import ElasticState
from kungfu_tf.elastic.step_function import function
from kungfu_tf.ops.elastic_membership import Change, detached, is_joiner
from kungfu_tf.ops.resize import ResizeError, resize

# Horovod's Keras callbacks (``hvd.elastic.CommitStateCallback``), imported from kungfu_tf.keras when first used.
_KERAS_CALLBACKS = ("CommitStateCallback", "UpdateBatchStateCallback", "UpdateEpochStateCallback")


def __getattr__(name: str) -> Any:
    if name in _KERAS_CALLBACKS:
        from kungfu_tf.keras import elastic_state_callbacks

        return getattr(elastic_state_callbacks, name)
    raise AttributeError(f"module 'kungfu_tf.elastic' has no attribute {name!r}")


__all__ = [
    "Change",
    "CommitStateCallback",
    "ElasticError",
    "ElasticState",
    "HostsUpdatedInterrupt",
    "JobEndedError",
    "JoinerRejectedError",
    "KerasState",
    "ObjectState",
    "ResizeError",
    "StateMismatchError",
    "TensorFlowKerasState",
    "TensorFlowState",
    "UpdateBatchStateCallback",
    "UpdateEpochStateCallback",
    "detached",
    "function",
    "is_joiner",
    "model_signature",
    "recover",
    "resize",
    "run",
]
