"""Keras callback: ``builders.Auto`` searches for a strategy on the batches of ``fit`` (``AutoSearchCallback``).

The search runs on training steps handed to it (kungfu_tf/strategy/step_driver.py):
between two of them it switches every worker to the next candidate, and a
step that failed under a candidate runs again under the next one. ``fit``
calls ``model.train_function`` once per batch, and reads it anew at every
batch; so the callback puts a stand-in there that hands each call to the
search, and makes fit's own train function again whenever a switch replaced
the strategy plan (the old trace would refuse to run). The trials are thus
``fit``'s own batches, and after the search ``fit`` goes on with the fastest
strategy measured; the stand-in steps aside when training ends.

Example:
    >>> import keras
    >>> import kungfu_tf.keras as kfk
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
    >>> from kungfu_tf.strategy import builders
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.Adam(1e-3), strategy=builders.Auto(budget=4, trial_steps=2))
    >>> model.compile(optimizer=opt, loss="mse", jit_compile=False)  # doctest: +SKIP
    >>> model.fit(x, y, epochs=3, callbacks=[kfk.AutoSearchCallback()])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras

from kungfu_tf.strategy import plan_generation, step_driver
from kungfu_tf.strategy.auto.builder import Auto


class SearchedTrainFunction:
    """Stands in for ``model.train_function``: each call goes to the search, on the current trace.

    Example:
        >>> class Model:  # what fit reads and makes again
        ...     def make_train_function(self, force=False):
        ...         self.train_function = lambda iterator: f"step on {iterator}"
        >>> model = Model(); model.make_train_function()
        >>> SearchedTrainFunction(model)("a batch")
        'step on a batch'
    """

    def __init__(self, model: Any) -> None:
        self._model = model
        self._inner = model.train_function
        self._generation = plan_generation.current()

    @property
    def inner(self) -> Any:
        """fit's own train function for the current strategy plan."""
        return self._inner

    def adopt(self) -> None:
        """Stands in again if something else made ``model.train_function`` anew (a policy's switch)."""
        current = self._model.train_function
        if current is not self:
            self._inner = current
            self._generation = plan_generation.current()
            object.__setattr__(self._model, "train_function", self)

    def __call__(self, iterator: Any) -> Any:
        return step_driver.run_step(lambda: self._current()(iterator))

    def _current(self) -> Any:
        generation = plan_generation.current()
        if generation != self._generation:
            # A switch (a trial's, or the search's last) replaced the plan: the old trace would refuse to run.
            self._model.make_train_function(force=True)
            self._inner = self._model.train_function
            self._generation = generation
            object.__setattr__(self._model, "train_function", self)
            object.__setattr__(self._model, "_kungfu_plan_generation", generation)  # retrace_if_replanned: done
        return self._inner


class AutoSearchCallback(keras.callbacks.Callback):
    """Runs the search of the optimizer's ``builders.Auto`` on the batches of ``model.fit``.

    Every worker passes it to its ``fit`` (same data sizes, same options).
    The first batches are the trials: each candidate (the same, in the same
    order, on every worker: consensus on its bytes) runs ``warmup`` +
    ``trial_steps`` batches; a candidate that fails (its switch, or the
    step's trace or run, on any worker) is scored as infinitely slow and the
    search goes on; then every worker switches to the fastest strategy
    measured, which stays in force for the rest of training
    (``optimizer``'s strategy builder keeps it as ``auto.result``). A
    search may span epochs, and ``fit`` calls: it goes on where it stopped.

    Batches, not steps: with ``compile(steps_per_execution=k)`` one call of
    the train function is k steps, and a trial step is one such call. A
    candidate that fails in its switch or its trace costs no batch; one whose
    step fails while running has consumed its batch (fit's iterator moved on),
    so the next candidate trains on the next batch.

    Without this callback, ``fit`` refuses an optimizer whose Auto search has
    not run (a ``StrategyError`` naming it) rather than train without searching.

    Example:
        >>> import kungfu_tf.keras as kfk
        >>> model.fit(x, y, epochs=3, callbacks=[kfk.AutoSearchCallback()])  # doctest: +SKIP
    """

    def __init__(self) -> None:
        super().__init__()
        self._stand_in: SearchedTrainFunction | None = None

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = getattr(self.model, "optimizer", None)
        strategy = getattr(optimizer, "_kungfu_strategy", None)
        if not isinstance(strategy, Auto):
            raise TypeError(
                "AutoSearchCallback runs the search of SynchronousSGDOptimizer(opt, strategy=builders.Auto(...)), "
                f"but the model's optimizer is {type(optimizer).__module__}.{type(optimizer).__qualname__}"
                + ("" if strategy is None else f" with the strategy {strategy!r}")
            )
        self.model.make_train_function()  # fit made it already; made here if a caller did not
        self._stand_in = SearchedTrainFunction(self.model)
        object.__setattr__(self.model, "train_function", self._stand_in)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self._stand_in is not None:
            self._stand_in.adopt()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._stand_in is not None and self.model.train_function is self._stand_in:
            object.__setattr__(self.model, "train_function", self._stand_in.inner)
        self._stand_in = None
