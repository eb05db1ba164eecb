"""Make workers die with the launcher even if it is SIGKILLed.

The launcher's try/finally cannot run after SIGKILL or an OOM kill, so
each worker asks the kernel (Linux ``prctl(PR_SET_PDEATHSIG)``) to send
it SIGKILL when its parent goes away.  The kernel ties this to the
*thread* that forked the child, so workers must be spawned from the
launcher's main thread.
"""

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1

# Resolved once in the parent: after fork only async-signal-safe work
# should happen, so the child must not load libraries or import modules.
_prctl = (
    getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if sys.platform == "linux"
    else None
)


def parent_death_preexec() -> Callable[[], None] | None:
    """Return a ``preexec_fn`` arming the death signal, or None off Linux."""
    if _prctl is None:
        return None
    parent_pid = os.getpid()
    prctl = _prctl

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        # The parent may have died between fork and prctl, in which case
        # the signal will never come: exit rather than run orphaned.
        if os.getppid() != parent_pid:
            os._exit(1)

    return arm
