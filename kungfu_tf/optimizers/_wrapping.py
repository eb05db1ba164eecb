"""Wrapping a Keras 3 optimizer: a subclass of its own class, rebuilt from its config.

Every Keras wrapper in :mod:`kungfu_tf.optimizers` (S-SGD, SMA, pair
averaging) returns an instance of a dynamic subclass of the wrapped
optimizer's class that overrides a few methods (``apply``, sometimes
``build``). A subclass instead of a wrapper object keeps ``isinstance``
checks, ``get_config``, learning-rate schedules and slot variables the
original's. The class attribute ``_kungfu_wrapped`` marks every wrapped
optimizer (the v1 wrappers set it too), so wrapping twice — with the same
wrapper or with two different ones — is refused.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers._wrapping import wrap_keras
    >>> def methods(base):
    ...     return {"apply": lambda self, grads, variables=None: base.apply(self, grads, variables)}
    >>> opt = wrap_keras(keras.optimizers.SGD(0.1), methods, "SGD, unchanged", "Example")
    >>> type(opt).__name__, isinstance(opt, keras.optimizers.SGD), opt._kungfu_wrapped
    ('SGD', True, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import keras

from kungfu_tf.optimizers.keras_build import build_as_apply_would
from kungfu_tf.optimizers.weight_decay_exclusion import copy_exclusions

# For require_keras's message, by the wrappers that also take v1 optimizers.
V1_TOO = " or a tf.compat.v1.train.Optimizer"


def check_not_wrapped(opt: Any) -> None:
    """Raises ``ValueError`` if ``opt`` was already wrapped by any kungfu_tf wrapper.

    Nesting wrappers would synchronise (or average) twice per step with
    colliding message keys; wrap the original optimizer once instead.
    """
    if getattr(opt, "_kungfu_wrapped", False):
        by = getattr(opt, "_kungfu_wrapper", "a kungfu_tf optimizer wrapper")
        raise ValueError(f"{type(opt).__name__} is already wrapped by {by} (already a {by}); wrap the original once")


def require_keras(opt: Any, wrapper: str, also: str = "") -> keras.optimizers.Optimizer:
    """``opt`` itself if it is an unwrapped Keras 3 optimizer; ``TypeError``/``ValueError`` otherwise.

    ``also`` names what else the wrapper accepts, for the error message.
    """
    check_not_wrapped(opt)
    if not isinstance(opt, keras.optimizers.Optimizer):
        raise TypeError(
            f"{wrapper} wraps a keras.optimizers.Optimizer (Keras 3){also}, "
            f"got {type(opt).__module__}.{type(opt).__qualname__}"
        )
    return opt


def wrap_keras(
    opt: keras.optimizers.Optimizer,
    methods: Callable[[type], dict[str, Any]],
    doc: str,
    wrapper: str,
    **attrs: Any,
) -> keras.optimizers.Optimizer:
    """A copy of ``opt`` whose class is a subclass of ``type(opt)`` with ``methods(type(opt))`` overridden.

    Args:
        opt: the Keras 3 optimizer to copy (not modified).
        methods: given the base class, returns the methods to override; they
            call the base class's methods explicitly (``base.apply(self, ...)``)
            because the subclass does not exist yet when they are defined.
        doc: the subclass's docstring.
        wrapper: the wrapper's public name, for error messages.
        **attrs: settings stored as class attributes, so that Keras'
            attribute tracking (which inspects instance attributes) ignores them.

    Returns:
        A new optimizer rebuilt from ``opt.get_config()``; if ``opt`` was
        already built, it is built on the same variables and its slots and
        iteration count are copied.
    """
    base = opt.__class__
    cls = type(
        base.__name__,
        (base,),
        {
            **methods(base),
            "__module__": base.__module__,
            "__doc__": doc,
            "_kungfu_wrapped": True,
            "_kungfu_wrapper": wrapper,
            **attrs,
        },
    )
    wrapped = _copy(opt, cls)
    if opt.built:
        # from_config starts from scratch; carry over slots and the iteration
        # count of an optimizer that has already trained.
        # As its apply built it (names in its scope): a joiner's warm-up step names them so.
        build_as_apply_would(wrapped, opt._trainable_variables)
        for mine, theirs in zip(wrapped.variables, opt.variables):
            mine.assign(theirs)
    return wrapped


def _copy(opt: keras.optimizers.Optimizer, cls: type) -> Any:
    """A ``cls`` made from ``opt``'s config (:func:`_config_for_copy`), with what the config leaves out."""
    config = _config_for_copy(opt)
    # LossScaleOptimizer.from_config would deserialise its inner optimizer, copied here already.
    copy = cls(**config) if "inner_optimizer" in config else cls.from_config(config)
    copy_exclusions(opt, copy)  # not in the config; needed before build
    return copy


def _config_for_copy(opt: keras.optimizers.Optimizer) -> dict[str, Any]:
    """``opt.get_config()`` for ``from_config`` to make a copy from, with the objects it holds rather than their
    serialised forms where ``from_config`` would have to find their classes by name.

    A learning-rate schedule of the user's own (a warm-up, as BERT's) is
    rarely registered with ``keras.saving.register_keras_serializable``:
    ``from_config`` raised ``TypeError: Could not locate class 'Warmup'``, so
    no wrapper could be made; a callable rate (``SGD(lambda: 0.1)``) was
    refused as a lambda. The copy takes the schedule or callable itself
    (shared with ``opt``: a function of the step); a ``LossScaleOptimizer``'s
    inner optimizer is copied the same way.
    """
    rate = getattr(opt, "_learning_rate", None)
    with _rates_left_out(opt):
        config = opt.get_config()
    if _kept_as_object(rate):
        config["learning_rate"] = rate
    inner = getattr(opt, "inner_optimizer", None)
    if isinstance(inner, keras.optimizers.Optimizer) and "inner_optimizer" in config:
        config["inner_optimizer"] = _copy(inner, type(inner))
    return config


def _kept_as_object(rate: Any) -> bool:
    return isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) or (
        callable(rate) and not isinstance(rate, keras.Variable)
    )


@contextlib.contextmanager
def _rates_left_out(opt: Any) -> Iterator[None]:
    """``opt``'s (and its inner optimizers') schedule or callable rate out of the way of ``get_config``, which
    would serialise it: a schedule without ``get_config`` or a lambda whose source cannot be read raise there."""
    swapped = []
    while isinstance(opt, keras.optimizers.Optimizer):
        rate = getattr(opt, "_learning_rate", None)
        if _kept_as_object(rate):
            object.__setattr__(opt, "_learning_rate", 0.0)
            swapped.append((opt, rate))
        opt = getattr(opt, "inner_optimizer", None)
    try:
        yield
    finally:
        for o, rate in swapped:
            object.__setattr__(o, "_learning_rate", rate)
