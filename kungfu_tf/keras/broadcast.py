"""Keras callback: every worker starts training from root's weights and optimizer state.

Example:
    >>> import kungfu_tf.keras as kfk
    >>> model.fit(x, y, callbacks=[kfk.BroadcastGlobalVariablesCallback(root=0)])  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from kungfu_tf.optimizers.keras_build import build_as_apply_would
from kungfu_tf.variables import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcasts the model's weights and the optimizer's variables from ``root``
    before the first training step.

    Horovod broadcasts after the first batch, so that first update averages
    gradients computed on different weights and applies them to different
    weights. Here the optimizer is built first (creating its slot variables,
    e.g. momentum, and its iteration counter), and everything is broadcast
    before the first gradient is computed: N workers then take exactly the
    steps one process would, starting from root's state.

    When the model is built (it has an ``Input``, or was called or built
    before ``fit``), the broadcast happens in ``on_train_begin``. A model that
    Keras builds lazily at the first step (a ``Sequential`` without
    ``Input``, as most examples are written) has no weights yet then, and a
    callback never sees the data. For such a model this callback takes over
    the first training step for one trace: it builds the model from the
    first batch's shapes and dtypes (a symbolic call, no computation), builds
    the optimizer, broadcasts both eagerly from inside the trace, and only
    then runs Keras' own ``train_step``. We chose this over broadcasting
    after the first step (Horovod's way) because that step would average
    gradients of different weights; building first keeps the guarantee exact
    in the lazy case too. The train function keeps calling Keras' own
    ``train_step`` afterwards (nothing is added to the traced step).

    Example:
        >>> import keras
        >>> from kungfu_tf.keras import BroadcastGlobalVariablesCallback
        >>> model = keras.Sequential([keras.layers.Dense(8), keras.layers.Dense(2)])  # built at fit
        >>> model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        >>> model.fit(x, y, callbacks=[BroadcastGlobalVariablesCallback()])  # doctest: +SKIP
    """

    def __init__(self, root: int = 0):
        super().__init__()
        self.root = root
        self.broadcast_done = False
        self._lazy_step_installed = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model
        if model.built:
            self._broadcast_model_and_optimizer()
            return
        # Built at the first step: wrap train_step for that one trace. fit()
        # made the train function (around the original train_step) before
        # calling us, so make it again around the wrapper.
        original = model.train_step

        def train_step_building_first(data: Any) -> Any:
            if not self.broadcast_done:
                x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
                inputs = tf.nest.map_structure(_symbolic_like, x)
                # Out of the trace, into eager mode: the variables are created
                # (and initialised) as if the model had been built before fit,
                # and the broadcast runs now, before the step's graph computes
                # any gradient from them.
                with tf.init_scope():
                    model(inputs, training=False)
                    self._broadcast_model_and_optimizer()
            return original(data)

        model.train_step = train_step_building_first
        self._lazy_step_installed = True
        model.make_train_function(force=True)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._lazy_step_installed:
            # The traced train function keeps the wrapper (a plain call to the
            # original now); the model itself gets its own method back.
            del self.model.train_step
            self._lazy_step_installed = False

    def _broadcast_model_and_optimizer(self) -> None:
        model = self.model
        optimizer = getattr(model, "optimizer", None)
        # Eager collectives may reuse a key once the previous use completed,
        # so the same prefixes serve every fit() call. Weights go first: some
        # optimizers (pair averaging) publish the model when they are built.
        broadcast_variables(list(model.weights), root=self.root, name="keras_broadcast_global_variables")
        if optimizer is not None:
            # Slot variables exist only once the optimizer is built (normally
            # at the first step); build now so they are broadcast too.
            build_as_apply_would(optimizer, model.trainable_variables)  # the names its step would give
            # A strategy with parameter servers keeps slots only on their
            # owners; such an optimizer says which variables every rank has.
            replicated = getattr(optimizer, "_kungfu_replicated_variables", None)
            variables = replicated() if callable(replicated) else optimizer.variables
            broadcast_variables(list(variables), root=self.root, name="keras_broadcast_optimizer_variables")
        self.broadcast_done = True


def _symbolic_like(t: Any) -> Any:
    # A Keras symbolic input with t's shape (batch dimension included, possibly
    # unknown) and dtype: calling the model on it builds every layer without
    # computing anything.
    if t is None:
        return None
    return keras.KerasTensor(tuple(t.shape), dtype=tf.as_dtype(t.dtype).name)
