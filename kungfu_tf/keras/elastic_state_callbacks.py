"""Horovod's elastic Keras callbacks for the re-run mode: ``fit`` is entered again from ``state.epoch``/``state.batch``.

With a :class:`~kungfu_tf.elastic.TensorFlowKerasState` (``KerasState``) inside
``kungfu_tf.elastic.run``, in Horovod's order:

* :class:`UpdateEpochStateCallback`: ``state.epoch`` = epochs finished, over
  every ``fit`` of the job (``fit`` is called with ``epochs=total - state.epoch``
  as Horovod's example does, or with ``initial_epoch=state.epoch``: both count);
* :class:`UpdateBatchStateCallback`: ``state.batch`` = batches finished in the
  current epoch (Horovod records the index of the last one, and its resumed
  epoch runs that batch again). A ``fit`` entered with ``state.batch > 0``
  resumes that epoch: it ends after the epoch's remaining
  ``steps - state.batch`` batches (``steps``: ``steps_per_epoch``, or the
  dataset's known length) and ``run`` enters the function once more for
  the next epochs. Keras 3 fixes an epoch's length when ``fit`` begins, so the
  rest of the epoch is not a shorter epoch of the same ``fit`` as in Horovod;
* :class:`CommitStateCallback`: ``state.commit()`` every ``batches_per_commit``
  batches and at each epoch's end; a membership change raises
  ``HostsUpdatedInterrupt`` out of ``fit`` there and ``run`` re-enters it.

Example (``kungfu-run --elastic -np 2 --max-np 3 python train.py``)::

    import kungfu_tf as hvd

    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=1)]

    @hvd.elastic.run
    def train(state):
        state.model.fit(dataset, steps_per_epoch=500 // hvd.size(), epochs=24 - state.epoch, callbacks=callbacks)

    train(state)
"""

from __future__ import annotations

from typing import Any

import keras


class CommitStateCallback(keras.callbacks.Callback):
    """``state.commit()`` after every ``batches_per_commit`` batches and at the end of each epoch.

    Example:
        >>> from kungfu_tf.elastic import ObjectState
        >>> CommitStateCallback(ObjectState(batch=0), batches_per_commit=10).batches_per_commit
        10
    """

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        if isinstance(batches_per_commit, bool) or not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError(f"CommitStateCallback: batches_per_commit must be an int >= 1, got {batches_per_commit!r}")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining = self.batches_per_commit  # every member starts counting at the same batch

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.batches_remaining = self.batches_per_commit
            self.state.commit()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """``state.batch`` = batches finished in the current epoch; a ``fit`` entered mid-epoch finishes only that epoch.

    Example:
        >>> from kungfu_tf.elastic import ObjectState
        >>> UpdateBatchStateCallback(ObjectState(batch=0)).state.batch
        0
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self._resumed_from = 0  # batches of the first epoch done before this fit began
        self._first_epoch = True

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._resumed_from = int(self.state.batch)
        self._first_epoch = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        resumed = self._resumed_from if self._first_epoch else 0
        self.state.batch = resumed + batch + 1
        steps = self.params.get("steps") if self.params else None
        if resumed and steps and self.state.batch >= steps:
            # The resumed epoch is complete: end this fit (its later epochs would be cut to the
            # first one's length) and have run() enter the function again at the next epoch.
            self.model.stop_training = True
            self.state._request_rerun()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.state.batch = 0
        self._first_epoch = False


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """``state.epoch`` = epochs finished over the whole job, whatever epoch numbers this ``fit`` uses.

    Example:
        >>> from kungfu_tf.elastic import ObjectState
        >>> UpdateEpochStateCallback(ObjectState(epoch=2)).state.epoch
        2
    """

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self._initial_epoch = int(state.epoch)
        self._first_keras_epoch: int | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._initial_epoch = int(self.state.epoch)
        self._first_keras_epoch = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._first_keras_epoch is None:
            self._first_keras_epoch = epoch  # 0 (epochs=total - state.epoch) or state.epoch (initial_epoch=)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        first = epoch if self._first_keras_epoch is None else self._first_keras_epoch
        self.state.epoch = self._initial_epoch + (epoch - first) + 1
