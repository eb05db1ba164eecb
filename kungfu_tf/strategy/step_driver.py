"""Who runs a training step: the step itself, or a search that turns the first steps into trials.

``builders.Auto`` searches for a strategy on the user's own training steps
(kungfu_tf/strategy/auto/builder.py): it must run code between two steps
(switch to the next candidate, read the clock) and around one (a step that
failed under a candidate is run again under the next). The step function
(``kungfu_tf.elastic.function``) hands each call to :func:`run_step`, which
gives it to the installed driver, or simply calls it. In Keras ``fit``,
``kungfu_tf.keras.AutoSearchCallback`` hands fit's calls of its train
function to it the same way.

:func:`in_step` tells whether the code running now is inside such a call:
a step traced anywhere else (a plain ``tf.function``, ``fit`` without the
callback) would train without the search ever running, so the optimizer
refuses it rather than fall back silently (kungfu_tf/optimizers/auto_search.py).

One driver at a time: the optimizer built last with ``builders.Auto`` drives
the steps (a process trains one model with one searching optimizer).

Example:
    >>> run_step(lambda: 3)
    3
    >>> class Twice:
    ...     def run_step(self, call):
    ...         call()
    ...         return call()
    >>> calls = []
    >>> install(Twice())
    >>> run_step(lambda: calls.append(1))
    >>> uninstall(); len(calls)
    2
    >>> in_step(), run_step(in_step)
    (False, True)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

StepCall = Callable[[], Any]


class StepDriver(Protocol):
    """Runs one step call (``call()`` runs the step once and returns its result)."""

    def run_step(self, call: StepCall) -> Any:
        """Runs the step (once or more) and returns the result of the run that counts."""


_lock = threading.Lock()
_driver: StepDriver | None = None
_local = threading.local()  # how deep this thread is in run_step calls (a step may run another's)


def install(driver: StepDriver) -> None:
    """Makes ``driver`` run every step from now on (in place of any driver before it)."""
    global _driver
    with _lock:
        _driver = driver


def uninstall(driver: StepDriver | None = None) -> None:
    """Steps run by themselves again (if ``driver`` is given: only if it is the installed one)."""
    global _driver
    with _lock:
        if driver is None or _driver is driver:
            _driver = None


def installed() -> StepDriver | None:
    """The driver running steps now, if any."""
    return _driver


def in_step() -> bool:
    """True inside :func:`run_step` (on this thread): the step was handed to whoever drives steps."""
    return getattr(_local, "depth", 0) > 0


def run_step(call: StepCall) -> Any:
    """Runs one step call through the installed driver, or directly."""
    driver = _driver
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        return call() if driver is None else driver.run_step(call)
    finally:
        _local.depth -= 1
