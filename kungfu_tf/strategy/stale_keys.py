"""The names under which the stale parameter servers of this process's strategy plans keep their data.

A stale or asynchronous parameter server keeps its values, slot replicas,
pushed gradients and clocks in the workers' p2p stores, under the plan's
keys (``<optimizer name>/p<serial>``, kungfu_tf/strategy/compiler.py), with
versions that count the plan's steps from 1. Two live optimizers with the
same ``name=`` would read and overwrite each other's (a GAN's generator and
discriminator, both left at the default name): :func:`claim` refuses the
second. An optimizer that is gone leaves its data behind; the plan that
takes its keys forgets them first (``StrategyPlan.forget_stored``), else
its first fetches would take the old plan's newer versions.

Example:
    >>> from kungfu_tf.strategy.stale_keys import claim
    >>> class Plan: ...
    >>> first = Plan()
    >>> claim("doc_stale_keys/p0", first)
    >>> claim("doc_stale_keys/p0", Plan())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kungfu_tf.strategy.errors.StrategyError: two optimizers with stale or asynchronous parameter servers share the name 'doc_stale_keys' ...
"""

from __future__ import annotations

import gc
import weakref

from kungfu_tf.strategy.errors import StrategyError

_live: weakref.WeakValueDictionary[str, object] = weakref.WeakValueDictionary()


def claim(keys: str, plan: object) -> None:
    """Records that ``plan`` keeps its stale data under ``keys``.

    Raises:
        StrategyError: another live plan holds ``keys`` (another optimizer with the same ``name=``).
    """
    other = _live.get(keys)
    if other is not None and other is not plan:
        gc.collect()  # an optimizer its user dropped may wait for the cycle collector
        other = _live.get(keys)
    if other is not None and other is not plan:
        name = keys.rsplit("/p", 1)[0]
        raise StrategyError(
            f"two optimizers with stale or asynchronous parameter servers share the name {name!r} (their values, "
            "pushed gradients and clocks would mix in the workers' stores); give each SynchronousSGDOptimizer its "
            "own name=..."
        )
    _live[keys] = plan
