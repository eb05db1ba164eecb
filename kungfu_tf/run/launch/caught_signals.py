"""The signals a launcher catches to stop its workers, and giving the previous handlers back.

Example:
    >>> import os, signal
    >>> seen = []
    >>> with caught_signals(lambda signum, frame: seen.append(signum)):
    ...     os.kill(os.getpid(), signal.SIGTERM)
    >>> seen == [signal.SIGTERM], signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    (True, True)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

# What the launcher passes on to its workers (SIGTERM, then SIGKILL after a grace).
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)

SignalHandler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


@contextmanager
def caught_signals(on_signal: Callable[[int, FrameType | None], Any]) -> Iterator[None]:
    """``on_signal`` handles FORWARDED_SIGNALS inside the block; the previous handlers are back after it.

    signal.signal only works in the main thread: a caller embedding the
    launcher on another thread keeps its own handling (nothing is caught).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, SignalHandler] = {signum: signal.signal(signum, on_signal) for signum in FORWARDED_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
