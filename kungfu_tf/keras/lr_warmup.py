"""Keras callback: Horovod's gradual learning-rate warm-up, ``initial_lr / size`` → ``initial_lr``.

Example:
    >>> import kungfu_tf
    >>> import kungfu_tf.keras as kfk
    >>> scaled_lr = 0.01 * kungfu_tf.size()   # linear scaling rule: pass the scaled rate
    >>> model.fit(x, y, callbacks=[kfk.LearningRateWarmupCallback(scaled_lr, warmup_epochs=5)])  # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from typing import Any

import keras

import kungfu_tf


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Raises the learning rate from ``initial_lr / size`` to ``initial_lr`` before every batch
    of the first ``warmup_epochs`` epochs, as Horovod's callback of this name does.

    With N workers the global batch is N times larger, so users scale the
    learning rate by N (linear scaling rule) and pass that scaled rate as
    ``initial_lr``; starting there diverges early in training, so Goyal et al.
    ("Accurate, Large Minibatch SGD", 2017) ramp it up from the one-worker
    rate instead. Before batch ``b`` (0-based) of epoch ``e < warmup_epochs``
    the rate is::

        initial_lr / size * (1 + (size - 1) * (e + (b + 1) / steps_per_epoch) / warmup_epochs)

    so the last warm-up batch runs at exactly ``initial_lr`` (the ``+ 1``
    makes each epoch end on a round value, as in Horovod). After the warm-up
    the callback no longer touches the rate, so a later schedule can take
    over. ``steps_per_epoch`` defaults to the number of steps ``fit`` reports
    to callbacks (``params["steps"]``); give it when ``fit`` cannot know it
    (a dataset of unknown length). At the end of every epoch the current rate
    is written to ``logs["lr"]``; ``verbose=1`` prints, on rank 0, when the
    warm-up is finished.

    Momentum correction (Goyal et al. §2.1, Horovod's ``momentum_correction``):
    Keras' momentum SGD keeps a velocity that already includes the learning
    rate (``v ← momentum·v − lr·g``), so when the rate changes from ``old``
    to ``new`` the velocity should be scaled by ``new / old``. Horovod does
    this by changing the momentum coefficient for one batch; Keras 3 bakes
    that coefficient into the traced step, so here the velocity slots
    themselves are multiplied by ``new / old`` before the batch, which gives
    the same update for (non-Nesterov) momentum SGD. Other optimizers with a
    non-zero ``momentum`` get no correction and a warning.

    The optimizer's learning rate must be a number (a variable), not a
    ``LearningRateSchedule``.

    Args:
        initial_lr: the rate at the end of the warm-up (usually already
            multiplied by the number of workers).
        warmup_epochs: number of epochs the ramp takes (> 0).
        momentum_correction: scale momentum SGD's velocity with the rate.
        steps_per_epoch: batches per epoch; None: found from ``fit``.
        verbose: 1 prints the end of the warm-up on rank 0.

    Raises:
        ValueError: a non-positive ``initial_lr``, ``warmup_epochs`` or
            ``steps_per_epoch``; at the start of training, when
            ``steps_per_epoch`` is None and ``fit`` does not know it.

    Example:
        >>> import keras
        >>> import kungfu_tf
        >>> from kungfu_tf.keras import LearningRateWarmupCallback
        >>> lr = 0.01 * kungfu_tf.size()
        >>> model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9), loss="mse")  # doctest: +SKIP
        >>> model.fit(ds, epochs=20, callbacks=[LearningRateWarmupCallback(lr, warmup_epochs=3)])  # doctest: +SKIP
    """

    def __init__(
        self,
        initial_lr: float,
        warmup_epochs: int = 5,
        momentum_correction: bool = True,
        steps_per_epoch: int | None = None,
        verbose: int = 0,
    ):
        super().__init__()
        if not initial_lr > 0:
            raise ValueError(f"initial_lr must be positive, got {initial_lr!r}")
        if not isinstance(warmup_epochs, int) or warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be a positive int, got {warmup_epochs!r}")
        if steps_per_epoch is not None and (not isinstance(steps_per_epoch, int) or steps_per_epoch <= 0):
            raise ValueError(f"steps_per_epoch must be a positive int or None, got {steps_per_epoch!r}")
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.momentum_correction = bool(momentum_correction)
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self._steps = steps_per_epoch
        self._epoch = 0

    def lr_at(self, epoch: int, batch: int, steps_per_epoch: int | None = None) -> float:
        """The rate this callback sets before ``batch`` of ``epoch`` (both 0-based), for this cluster's size.

        Example:
            >>> LearningRateWarmupCallback(0.1, warmup_epochs=2).lr_at(1, 9, steps_per_epoch=10)  # the last one
            0.1
        """
        steps = steps_per_epoch or self._steps
        if steps is None:
            raise ValueError("steps_per_epoch is not known yet: pass it, or call lr_at once fit has started")
        size = kungfu_tf.size()
        progress = epoch + (batch + 1) / steps
        return self.initial_lr / size * (1.0 + (size - 1) * progress / self.warmup_epochs)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.steps_per_epoch is None:
            steps = (self.params or {}).get("steps")
            if not steps:
                raise ValueError(
                    "LearningRateWarmupCallback: fit() does not know the number of batches per epoch "
                    f"(params['steps'] is {steps!r}); pass steps_per_epoch"
                )
            self._steps = int(steps)
        optimizer = self.model.optimizer
        if self.momentum_correction and not _velocities_known(optimizer) and getattr(optimizer, "momentum", None):
            warnings.warn(
                f"LearningRateWarmupCallback: no momentum correction for {type(optimizer).__name__} "
                "(only momentum SGD's velocity is rescaled)",
                stacklevel=2,
            )

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._epoch >= self.warmup_epochs:
            return
        optimizer = self.model.optimizer
        old = float(optimizer.learning_rate.numpy())
        new = self.lr_at(self._epoch, batch)
        optimizer.learning_rate = new  # assigns the existing variable
        # Before the first step the optimizer may not be built yet: its
        # velocities are zero then, nothing to correct.
        if self.momentum_correction and old > 0 and new != old and _velocities_known(optimizer) and optimizer.built:
            ratio = new / old
            for velocity in optimizer.momentums:
                if velocity is not None:
                    velocity.assign(velocity * ratio)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        lr = float(self.model.optimizer.learning_rate.numpy())
        if logs is not None:
            logs["lr"] = lr
        if epoch == self.warmup_epochs - 1 and self.verbose and kungfu_tf.rank() == 0:
            print(f"\nEpoch {epoch + 1}: learning-rate warm-up finished at {lr:.6g}.", flush=True)


def _velocities_known(optimizer: Any) -> bool:
    # Keras' SGD keeps its velocities in `momentums` (when momentum != 0);
    # wrapped optimizers (SynchronousSGDOptimizer) are subclasses of SGD.
    return isinstance(optimizer, keras.optimizers.SGD) and optimizer.momentum != 0
