"""Rank 0 speaks for the cluster: ``verbose()`` and ``RankZeroOnly``.

N workers printing N progress bars, or writing N checkpoints to one shared
path, is noise at best and a corrupt file at worst.

Example:
    >>> import kungfu_tf.keras as kfk
    >>> model.fit(x, y, verbose=kfk.verbose(),
    ...           callbacks=[kfk.RankZeroOnly(keras.callbacks.ModelCheckpoint("m.keras"))])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras

import kungfu_tf


def verbose(level: int = 1) -> int:
    """``level`` on rank 0, 0 on every other worker: pass as ``fit(verbose=...)``.

    Example:
        >>> import kungfu_tf.keras
        >>> kungfu_tf.keras.verbose()  # one worker: rank 0
        1
    """
    return level if kungfu_tf.rank() == 0 else 0


_HOOKS = (
    "on_batch_begin", "on_batch_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end",
    "on_predict_batch_begin", "on_predict_batch_end", "on_train_begin", "on_train_end",
    "on_test_begin", "on_test_end", "on_predict_begin", "on_predict_end",
)


class RankZeroOnly(keras.callbacks.Callback):
    """Forwards every callback event to ``callback`` on rank 0 and drops it elsewhere.

    For callbacks with side effects that one worker should perform for all:
    ``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``, ``BackupAndRestore``.
    Do not wrap callbacks that change training (they would change it on rank 0
    only, and the workers would diverge) or that issue collectives.

    Example:
        >>> import keras
        >>> from kungfu_tf.keras import RankZeroOnly
        >>> ckpt = RankZeroOnly(keras.callbacks.ModelCheckpoint("ckpt.weights.h5", save_weights_only=True))
        >>> model.fit(x, y, callbacks=[ckpt])  # doctest: +SKIP
    """

    def __init__(self, callback: keras.callbacks.Callback, rank: int | None = None):
        super().__init__()
        self.callback = callback
        self.active = (kungfu_tf.rank() if rank is None else rank) == 0
        # Keep Keras' asynchronous batch-end dispatch if the wrapped callback allows it.
        self.async_safe = getattr(callback, "async_safe", False)

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        if self.active:
            self.callback.set_params(params)

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if self.active:
            self.callback.set_model(model)


def _forwarder(hook: str):
    def forward(self: RankZeroOnly, *args: Any, **kwargs: Any) -> None:
        if self.active:
            getattr(self.callback, hook)(*args, **kwargs)

    forward.__name__ = hook
    forward.__doc__ = f"Calls the wrapped callback's ``{hook}`` on rank 0 only."
    return forward


# Generated rather than written out: the same two lines for every Keras hook.
for _hook in _HOOKS:
    setattr(RankZeroOnly, _hook, _forwarder(_hook))
del _hook
