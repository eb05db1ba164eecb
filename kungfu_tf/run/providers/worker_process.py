"""One worker: a child process in its own process group plus its output."""

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import BinaryIO

from kungfu_tf.run.providers.output import Console, OutputRelay
from kungfu_tf.run.providers.parent_death import parent_death_preexec
from kungfu_tf.run.worker_env.placement import Peer


class WorkerProcess:
    """A started worker whose output is relayed once :meth:`start_output` runs.

    Each worker leads its own process group so that signals reach any
    children it forks, and so that a Ctrl-C on the terminal goes only to
    the launcher, which then decides how to stop the workers.
    """

    def __init__(
        self,
        peer: Peer,
        command: Sequence[str],
        env: Mapping[str, str],
        console: Console,
        *,
        echo: bool,
        log: BinaryIO | None,
    ):
        """Start the process; raises OSError if ``command`` cannot be run.

        ``log`` receives the raw output; it is closed by
        :meth:`finish_output`, or here if the process cannot be started.
        """
        self.peer = peer
        try:
            self._proc = popen_worker(command, env)
        except OSError:
            if log is not None:
                log.close()
            raise
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._relay = OutputRelay(
            peer.rank,
            self._proc.stdout,
            self._proc.stderr,
            console,
            echo=echo,
            log=log,
        )

    @property
    def pid(self) -> int:
        """Process id, which is also the id of the worker's process group."""
        return self._proc.pid

    def start_output(self) -> None:
        """Begin relaying output (kept separate so that no reader thread
        exists while later workers are forked with a preexec_fn)."""
        self._relay.start()

    def poll(self) -> int | None:
        """Return the Popen-style return code, or None while running."""
        return self._proc.poll()

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker's whole process group.

        Once the leader has been reaped its pid may be reused, so the group
        is only signalled while the leader is known to be unreaped.
        """
        if self._proc.poll() is not None:
            return
        try:
            os.killpg(self._proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill_group(self) -> None:
        """SIGKILL the group even after the leader exited, to catch any
        grandchildren left behind; used only when tearing the job down."""
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the leader to exit and return its return code."""
        return self._proc.wait(timeout)

    def finish_output(self, timeout: float) -> None:
        """Wait (bounded) for the relay threads to drain the pipes."""
        self._relay.join(timeout)


def describe_exit(returncode: int) -> str:
    """``failed with exit code N`` or ``killed by signal SIGNAME``."""
    if returncode < 0:
        return f"killed by signal {_signal_name(-returncode)}"
    return f"failed with exit code {returncode}"


def exit_cause(returncode: int) -> str:
    """Short cause of a worker's death for membership logs: ``killed by SIGKILL``, ``exit code 3``."""
    if returncode < 0:
        return f"killed by {_signal_name(-returncode)}"
    return f"exit code {returncode}"


def exit_status(returncode: int) -> int:
    """Shell convention: a death by signal N becomes status 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def popen_worker(command: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen:
    """Start a worker with exactly ``env``, its output piped, in its own process group, dying with its parent.

    Call it before starting any thread in this process (the pre-exec hook
    runs between fork and exec): the supervisor forks all workers before its
    reader threads, a Ray actor from its only execution thread.
    """
    return subprocess.Popen(
        list(command),
        env=dict(env),
        # N workers reading one terminal would fight over it.
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        process_group=0,
        preexec_fn=parent_death_preexec(),  # noqa: PLW1509
    )
