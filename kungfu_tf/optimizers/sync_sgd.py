"""``SynchronousSGDOptimizer``: synchronous data-parallel SGD for Keras 3 and v1 optimizers.

Gradients are averaged over all workers (fused all-reduce; all-gather for
``tf.IndexedSlices``) before the wrapped optimizer applies them, as Horovod's
``DistributedOptimizer`` and KungFu's S-SGD do. Started from identical
weights, every worker takes the step one process would take on the union of
all workers' batches.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
    >>> type(opt).__name__, isinstance(opt, keras.optimizers.SGD)
    ('SGD', True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from kungfu_tf.optimizers._wrapping import check_not_wrapped, wrap_keras
from kungfu_tf.optimizers.gradient_monitor import GradientMonitor
from kungfu_tf.optimizers.gradient_order import after_gradients
from kungfu_tf.optimizers.gradient_sync import (
    DEFAULT_FUSION_THRESHOLD_BYTES,
    average_gradients,
    average_gradients_with_rider,
)
from kungfu_tf.optimizers.keras_build import build_as_apply_would
from kungfu_tf.optimizers.loss_scale_guard import refuse_inside_loss_scale
from kungfu_tf.optimizers.sync_sgd_v1 import DEFAULT_NAME, SynchronousSGDOptimizerV1
from kungfu_tf.strategy.source import StrategySource, check_source


def loss_unscaler(opt: keras.optimizers.Optimizer, variables: Any = None) -> Callable[[list[Any]], list[Any]]:
    """Divides gradients by ``opt``'s dynamic loss scale if it is a LossScaleOptimizer; else the identity.

    Builds an unbuilt LossScaleOptimizer first (as its ``apply`` would), so that
    a traced step reads the scale variable, not the initial scale as a constant.
    """
    if not isinstance(opt, keras.optimizers.LossScaleOptimizer):
        return lambda grads: grads
    if variables is not None:
        build_as_apply_would(opt, variables)

    def unscale(grads: list[Any]) -> list[Any]:
        inverse = 1.0 / tf.convert_to_tensor(opt.dynamic_scale)
        out = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                out.append(tf.IndexedSlices(g.values * tf.cast(inverse, g.values.dtype), g.indices, g.dense_shape))
            else:
                out.append(None if g is None else g * tf.cast(inverse, g.dtype))
        return out

    return unscale


def _wrap_keras(
    opt: keras.optimizers.Optimizer, fusion_threshold_bytes: int, sparse_as_dense: bool, name: str
) -> keras.optimizers.Optimizer:
    """A copy of ``opt`` whose class averages gradients in ``apply``."""

    def methods(base: type) -> dict[str, Any]:
        def apply(self: keras.optimizers.Optimizer, grads: Any, trainable_variables: Any = None) -> Any:
            # Keras 3 funnels apply_gradients() and model.fit() through apply();
            # averaging here, before loss-scale unscaling, clipping, accumulation
            # and the update, keeps every worker's optimizer state identical.
            refuse_inside_loss_scale(self, "SynchronousSGDOptimizer")
            grads = list(grads)
            monitor = self.kungfu_monitor
            if monitor is None:
                grads = average_gradients(
                    grads, self._kungfu_fusion_threshold_bytes, self._kungfu_sparse_as_dense, name=self._kungfu_name
                )
                with after_gradients(grads):
                    return base.apply(self, grads, trainable_variables)
            # A LossScaleOptimizer unscales after the average: the monitor
            # must see true gradients, or tr(Σ) and |G|² (AdaScale's inputs)
            # come out multiplied by the loss scale squared.
            unscale = loss_unscaler(self, trainable_variables)
            local = monitor.local_statistics(unscale(grads))
            averaged, rider = average_gradients_with_rider(
                grads, local.rider, self._kungfu_fusion_threshold_bytes, self._kungfu_sparse_as_dense, self._kungfu_name
            )
            # Inside tf.function the monitor's assignments run by themselves
            # (automatic control dependencies); eagerly they already ran.
            monitor.update(local, rider, unscale(grads), unscale(averaged), self._kungfu_name)
            with after_gradients(averaged):
                return base.apply(self, averaged, trainable_variables)

        def build(self: keras.optimizers.Optimizer, variables: Any) -> None:
            refuse_inside_loss_scale(self, "SynchronousSGDOptimizer")  # built on every worker, finite gradients or not
            base.build(self, variables)

        return {"apply": apply, "build": build}

    return wrap_keras(
        opt,
        methods,
        f"{type(opt).__name__} with gradients averaged over all kungfu_tf workers.",
        "SynchronousSGDOptimizer",
        _kungfu_fusion_threshold_bytes=fusion_threshold_bytes,
        _kungfu_sparse_as_dense=sparse_as_dense,
        _kungfu_name=name,
        kungfu_monitor=None,
    )


def check_monitor(monitor: Any) -> None:
    """``TypeError`` unless ``monitor`` is None or a :class:`GradientMonitor`."""
    if monitor is not None and not isinstance(monitor, GradientMonitor):
        raise TypeError(
            f"monitor must be a kungfu_tf.optimizers.GradientMonitor or None, got "
            f"{type(monitor).__module__}.{type(monitor).__qualname__}"
        )


def SynchronousSGDOptimizer(  # a factory named like the class it returns, as in Horovod
    opt: keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer,
    fusion_threshold_bytes: int = DEFAULT_FUSION_THRESHOLD_BYTES,
    sparse_as_dense: bool = False,
    name: str | None = None,
    strategy: StrategySource | None = None,
    monitor: GradientMonitor | None = None,
) -> keras.optimizers.Optimizer | tf.compat.v1.train.Optimizer:
    """Wraps ``opt`` so that gradients are averaged over all workers before it applies them.

    Args:
        opt: a Keras 3 optimizer (``keras.optimizers.Optimizer``) or a
            ``tf.compat.v1.train.Optimizer``.
        fusion_threshold_bytes: dense gradients are averaged in fused buckets
            of at most this many bytes (default 64 MiB); 0: one all-reduce
            per gradient.
        sparse_as_dense: all-reduce ``tf.IndexedSlices`` gradients as dense
            tensors instead of all-gathering the slices (better when the
            slices cover most of the variable).
        name: prefix of the collectives' message keys (default
            ``"kungfu_sync_sgd"``); for v1 also the optimizer's name.
        strategy: per-variable synchronisation (see :mod:`kungfu_tf.strategy`):
            a ``Strategy`` proto, a builder instance (e.g.
            ``builders.Parallax()``), a builder name (``"PSLoadBalancing"``) or
            a strategy file (protobuf text or JSON). The strategy is made or
            checked against the model when the optimizer first sees its
            variables, and the workers check that they all hold the same one.
            None (default): every gradient all-reduced as described above
            (``fusion_threshold_bytes`` and ``sparse_as_dense`` apply only
            then). Pass an unbuilt optimizer.
        monitor: a :class:`~kungfu_tf.optimizers.GradientMonitor` that the
            step updates (gradient noise scale, gradient variance, compute
            times); the wrapped optimizer exposes it as ``kungfu_monitor``
            (None without one) and tracks it, so checkpoints of the optimizer
            carry its state. With a strategy, every variable must be
            all-reduced (no parameter servers).

    Returns:
        Keras 3: a new instance of a subclass of ``opt``'s class, rebuilt from
        ``opt.get_config()`` (state copied if ``opt`` was built); use it in
        place of ``opt``. v1: a :class:`SynchronousSGDOptimizerV1` delegating
        to ``opt``.

    Raises:
        TypeError: ``opt`` is not an optimizer of either kind.
        ValueError: ``opt`` is already wrapped, or ``fusion_threshold_bytes < 0``,
            or ``monitor`` already belongs to another optimizer.

    Keras ``compile``: use ``jit_compile=False`` (tested) or the default
    ``"auto"`` (works); the collectives are custom ops without XLA kernels,
    so ``jit_compile=True`` is not supported.

    Example:
        >>> import keras
        >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
        >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        >>> opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01, momentum=0.9))
        >>> model.compile(optimizer=opt, loss="mse", jit_compile=False)
    """
    check_not_wrapped(opt)
    if strategy is not None:
        check_source(strategy)
    if not isinstance(fusion_threshold_bytes, int) or fusion_threshold_bytes < 0:
        raise ValueError(f"fusion_threshold_bytes must be an int >= 0, got {fusion_threshold_bytes!r}")
    check_monitor(monitor)
    if isinstance(opt, keras.optimizers.Optimizer):
        if strategy is None:
            wrapped = _wrap_keras(opt, fusion_threshold_bytes, sparse_as_dense, name or DEFAULT_NAME)
        else:
            if opt.built:
                raise ValueError("pass an optimizer that is not built yet when using a strategy")
            from kungfu_tf.optimizers.strategy_sync import wrap_keras_with_strategy

            wrapped = wrap_keras_with_strategy(opt, strategy, name or DEFAULT_NAME)
        if monitor is not None:
            monitor.attach(wrapped)
            # An instance attribute, so that the optimizer tracks the module and
            # its checkpoints carry the monitor's state.
            wrapped.kungfu_monitor = monitor
        return wrapped
    if isinstance(opt, tf.compat.v1.train.Optimizer):
        return SynchronousSGDOptimizerV1(
            opt, fusion_threshold_bytes, sparse_as_dense, name, strategy=strategy, monitor=monitor
        )
    raise TypeError(
        "SynchronousSGDOptimizer wraps a keras.optimizers.Optimizer (Keras 3) or a "
        f"tf.compat.v1.train.Optimizer, got {type(opt).__module__}.{type(opt).__qualname__}"
    )
