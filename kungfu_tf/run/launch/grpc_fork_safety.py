"""Keep gRPC's fork handlers out of the elastic launcher's forks.

The elastic launcher starts joiners while its gRPC threads (the config
service, the long poll) run, and it forks them with a ``preexec_fn`` (the
parent-death signal, kungfu_tf/run/providers/parent_death.py), so fork handlers run.
gRPC's handlers, enabled by default, then leave the child with a poller
whose descriptors are gone: 1 fork in 6 died with SIGABRT before exec
("epoll_wait error: Bad file descriptor") in our tests. The child never
uses gRPC before exec, so the handlers are not needed. gRPC reads the
switch once, when it is first imported.
"""

import os
import sys

FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"


def disable_grpc_fork_handlers() -> None:
    """Turn gRPC's fork handlers off for this process; call before ``import grpc``.

    Raises:
        RuntimeError: gRPC was already imported with its fork handlers on
            (then it is too late; run the launcher in a process of its own).
    """
    if "grpc" in sys.modules and os.environ.get(FORK_SUPPORT_ENV, "").lower() not in ("0", "false"):
        raise RuntimeError(
            f"gRPC was imported before the elastic launcher could set {FORK_SUPPORT_ENV}=0; "
            "run kungfu-run in a process of its own (or export the variable)"
        )
    os.environ[FORK_SUPPORT_ENV] = "0"
