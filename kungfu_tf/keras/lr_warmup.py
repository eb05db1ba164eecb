"""Keras callback: linear learning-rate warm-up to ``initial_lr · size`` (Goyal et al.).

Example:
    >>> import kungfu_tf.keras as kfk
    >>> model.fit(x, y, callbacks=[kfk.LearningRateWarmupCallback(0.1, warmup_epochs=5)])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras

import kungfu_tf


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Raises the learning rate linearly from ``initial_lr`` to ``initial_lr · size``
    over the first ``warmup_epochs`` epochs, then leaves it alone.

    With N workers the global batch is N times larger, so the learning rate
    should be N times larger too (linear scaling rule), but starting there
    diverges early in training; Goyal et al. ("Accurate, Large Minibatch SGD",
    2017) ramp it up linearly instead. At progress ``p`` epochs into training
    the rate is ``initial_lr · (1 + (size - 1) · p / warmup_epochs)``. With
    ``steps_per_epoch`` it is updated before every batch (``p = epoch +
    batch / steps_per_epoch``), otherwise before every epoch (``p = epoch``).
    At the end of the last warm-up epoch it is set to exactly
    ``initial_lr · size``; after that the callback no longer touches it, so a
    later schedule can take over. ``verbose=1`` prints the rate on rank 0
    at each epoch start during warm-up.

    The optimizer's learning rate must be a number (a variable), not a
    ``LearningRateSchedule``.

    Example:
        >>> import kungfu_tf
        >>> from kungfu_tf.keras import LearningRateWarmupCallback
        >>> lr = 0.01
        >>> model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9), loss="mse")  # doctest: +SKIP
        >>> model.fit(ds, epochs=20, callbacks=[LearningRateWarmupCallback(lr, warmup_epochs=3,
        ...                                                                 steps_per_epoch=100)])  # doctest: +SKIP
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5, steps_per_epoch: int | None = None,
                 verbose: int = 0):
        super().__init__()
        if warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be positive, got {warmup_epochs}")
        if steps_per_epoch is not None and steps_per_epoch <= 0:
            raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._epoch = 0

    def lr_at(self, progress: float) -> float:
        """The learning rate ``progress`` epochs into training (a Python float).

        Example:
            >>> LearningRateWarmupCallback(0.1, warmup_epochs=4).lr_at(0.0)  # any size
            0.1
        """
        size = kungfu_tf.size()
        if progress >= self.warmup_epochs:
            return self.initial_lr * size
        return self.initial_lr * (1.0 + (size - 1) * progress / self.warmup_epochs)

    def _set_lr(self, lr: float) -> None:
        self.model.optimizer.learning_rate = lr  # assigns the existing variable

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        if epoch >= self.warmup_epochs:
            return
        self._set_lr(self.lr_at(float(epoch)))
        if self.verbose and kungfu_tf.rank() == 0:
            print(f"Epoch {epoch + 1}: LearningRateWarmupCallback sets learning rate to {self.lr_at(epoch):.6g}.",
                  flush=True)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.steps_per_epoch is None or self._epoch >= self.warmup_epochs:
            return
        self._set_lr(self.lr_at(self._epoch + batch / self.steps_per_epoch))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if epoch == self.warmup_epochs - 1:
            # Per-batch updates stop just short of the target: land on it.
            self._set_lr(self.lr_at(float(self.warmup_epochs)))
