"""Waiting for events in tests without racing the machine's speed.

A test that asserts "this took less than N seconds" is red on a slow or
loaded host although nothing is wrong. The tests wait for the event itself
instead (a counter, a state, a call that returns), and give up only after
HANG_BOUND_SECONDS: far above what the event costs on any host, so the bound
turns a hang into a failure and never decides a verdict. To tell "woken by
the event" from "ended by a timeout", a test makes the timeout longer than
the hang bound: then only the event can end the wait in time.

Example::

    from waiting import eventually, returns

    assert eventually(lambda: server.long_polls_waiting == 1)
    state = returns(lambda: client.wait_job_state(1, 3600))  # woken: not the hour
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Only rules out "never": events here take milliseconds.
HANG_BOUND_SECONDS = 120.0
# A timeout that a test wants never to fire while it runs.
NEVER_SECONDS = 3600.0


def eventually(done: Callable[[], bool], seconds: float = HANG_BOUND_SECONDS) -> bool:
    """Poll ``done`` every 10 ms until it holds; False if it still does not after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return done()
        time.sleep(0.01)
    return True


def returns(fn: Callable[[], T], seconds: float = HANG_BOUND_SECONDS) -> T:
    """``fn()``'s result, computed on a thread; AssertionError if it has not returned
    after ``seconds`` (the thread is left behind, as a daemon). Exceptions propagate."""
    result: dict[str, object] = {}

    def call() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (re-raised on the caller's thread)
            result["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{getattr(fn, '__name__', fn)} did not return within {seconds:g} s (a hang)")
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["value"]  # type: ignore[return-value]
