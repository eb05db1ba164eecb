"""A Keras optimizer's clipping by norm, done by the strategy plan when parameter servers hold the gradients.

Under parameter servers no worker has every averaged gradient, so Keras's
own ``clipnorm``/``global_clipnorm`` (in ``apply``) saw only the owner's
part: the plan clips instead (kernels/gradient_clip.py), and the wrapped
optimizer's ``apply`` runs with its clipping by norm turned off.

Example::

    clip = norm_clip_of(opt)              # GradientClip("global", 1.0) for global_clipnorm=1.0
    with clipping_by_norm_off(opt):       # while the plan's clipped gradients are applied
        base.apply(opt, grads, variables)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.kernels.gradient_clip import GradientClip


def norm_clip_of(opt: Any) -> GradientClip | None:
    """The clipping by norm ``opt`` was made with (Keras allows one of clipnorm, clipvalue, global_clipnorm),
    for the plan to do.

    Raises:
        StrategyError: with ``gradient_accumulation_steps`` (Keras clips the accumulated mean on the steps
            that update, which the plan, clipping each step's gradients, cannot): the same on every worker.
    """
    clip = None
    if opt.clipnorm and opt.clipnorm > 0:
        clip = GradientClip("norm", float(opt.clipnorm))
    elif opt.global_clipnorm and opt.global_clipnorm > 0:
        clip = GradientClip("global", float(opt.global_clipnorm))
    if clip is not None and opt.gradient_accumulation_steps:
        raise StrategyError(
            f"{type(opt).__name__}: clipping by norm ({clip.kind} {clip.value}) with gradient_accumulation_steps="
            f"{opt.gradient_accumulation_steps} under parameter servers is not supported: Keras clips the "
            "accumulated mean, whose norm no worker holds; use clipvalue, an all-reduce strategy, or no "
            "accumulation"
        )
    return clip


@contextlib.contextmanager
def clipping_by_norm_off(opt: Any) -> Iterator[None]:
    """``opt`` without clipping by norm inside the block (Keras reads the attributes as ``apply`` traces)."""
    saved = opt.clipnorm, opt.global_clipnorm
    opt.clipnorm = opt.global_clipnorm = None
    try:
        yield
    finally:
        opt.clipnorm, opt.global_clipnorm = saved
