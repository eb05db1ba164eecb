"""Keras callback: run adaptation policies during ``model.fit`` (``PolicyCallback``).

Example:
    >>> import kungfu_tf.keras as kfk
    >>> from kungfu_tf.data import adaptive_batch, shard
    >>> from kungfu_tf.policy import GNSBatchSizePolicy
    >>> cb = kfk.PolicyCallback([GNSBatchSizePolicy(max_batch_size=1024)], batch_size=64, lr_rule="sqrt")
    >>> model.fit(adaptive_batch(shard(ds), cb.local_batch_size), epochs=10, callbacks=[cb])  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from kungfu_tf.keras.elastic_callback import retrace_if_replanned
from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.runner import PolicyRunner
from kungfu_tf.policy.variable_access import EagerVariableAccess


class PolicyCallback(keras.callbacks.Callback):
    """Drives a :class:`~kungfu_tf.policy.PolicyRunner` from ``fit``: train, epoch and batch begin/end.

    The model's optimizer (its learning-rate variable, and its
    ``kungfu_monitor`` if it was wrapped with a ``GradientMonitor``) is found
    when training begins. Keras fetches each batch inside the traced train
    function, after ``on_train_batch_begin``, so a change applied between
    steps shapes the very next batch; the train function is not traced
    again. With ``compile(steps_per_execution=k)`` Keras calls the batch
    hooks once per k steps, so policies see (and change) every k-th step.
    Every keyword is the runner's (``batch_size``, ``lr_rule``,
    ``monitor``, ``min_dwell_steps``, ``min_relative_change``, ``log_dir``,
    ...). Place it before callbacks that read the learning rate.

    Epochs: an ``adaptive_batch`` dataset has no known length, so Keras
    counts the steps of the first epoch and runs every later epoch for that
    many steps (Keras 3 caches the count; a callback cannot reset it). After
    the batch size grows, a later epoch runs out of data first (Keras warns
    "Your input ran out of data" and ends the epoch there: every row is
    still used once); after it shrinks, an epoch stops at the old count and
    the rest of that pass is skipped. For exact epochs, give Keras the
    length: ``.repeat()`` the data before ``adaptive_batch`` and pass
    ``steps_per_epoch`` (then an epoch is a number of steps, not a pass).

    A worker that a policy's resize detaches from an elastic job stops
    ``fit`` after that batch (``runner.detached``).

    State: add :attr:`state` to your checkpoint (with the model and the
    optimizer); a callback whose restored state has taken steps continues
    with that batch size, its counters and the policies' references.

    Example:
        >>> import kungfu_tf.keras as kfk
        >>> from kungfu_tf.data import adaptive_batch
        >>> from kungfu_tf.policy import GNSBatchSizePolicy
        >>> cb = kfk.PolicyCallback([GNSBatchSizePolicy(1024, every=50)], batch_size=64, log_dir="logs")
        >>> model.fit(adaptive_batch(ds, cb.local_batch_size), epochs=5, callbacks=[cb])  # doctest: +SKIP
    """

    def __init__(self, policies: Sequence[BasePolicy], **runner_args: Any):
        super().__init__()
        self.runner = PolicyRunner(policies, **runner_args)

    @property
    def state(self) -> Any:
        """The runner's checkpointable state (batch size, counters, policy references): add it to
        your checkpoint, e.g. ``tf.train.Checkpoint(model=model, optimizer=model.optimizer, policy=cb.state)``;
        restored before ``fit``, training continues where it stopped."""
        return self.runner.state

    @property
    def local_batch_size(self) -> Any:
        """The per-worker batch-size variable, for ``kungfu_tf.data.adaptive_batch``."""
        return self.runner.local_batch_size

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        access = self.runner.access
        if isinstance(access, EagerVariableAccess):  # the callback's own (fit's model brings the optimizer)
            access.bind(optimizer=optimizer)
        self.runner.before_train()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.runner.after_train()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.runner.epoch = epoch
        self.runner.before_epoch()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.runner.after_epoch()
        if logs is not None:
            for name in ("batch_size", "learning_rate"):
                value = getattr(self.runner, name)
                if value is not None:
                    logs[name] = value

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.runner.before_step()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.runner.after_step()
        retrace_if_replanned(self.model)  # a StrategyPolicy switched: fit traces its step again
        if self.runner.detached:
            # A resize (e.g. a StragglerPolicy's eviction) took this worker out of the job: stop now.
            self.model.stop_training = True
