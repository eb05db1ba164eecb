"""Elastic training: change the set of workers while training runs, and survive crashed ones.

Start the job with ``kungfu-run --elastic [--min-np A] [--max-np B] -np N``.

* :class:`ElasticState` holds what every worker must agree on (variables,
  step, epoch, data position, policy state); ``check()`` at step boundaries
  applies membership changes, ``sync()`` makes the state identical.
* :func:`run` wraps a training function: joiners join, crashed peers are
  reported and the function resumes on the survivors.
* :func:`resize` (``kungfu_tf.ops.resize``) shrinks, evicts or grows the job.
* :func:`is_joiner`, :func:`model_signature`.

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

from kungfu_tf.elastic.errors import (
    ElasticError,
    JobEndedError,
    JoinerRejectedError,
    StateMismatchError,
)
from kungfu_tf.elastic.runner import recover, run
from kungfu_tf.elastic.signature import model_signature
from kungfu_tf.elastic.state import ElasticState
from kungfu_tf.ops.elastic_membership import Change, is_joiner
from kungfu_tf.ops.resize import ResizeError, resize

__all__ = [
    "Change",
    "ElasticError",
    "ElasticState",
    "JobEndedError",
    "JoinerRejectedError",
    "ResizeError",
    "StateMismatchError",
    "is_joiner",
    "model_signature",
    "recover",
    "resize",
    "run",
]
