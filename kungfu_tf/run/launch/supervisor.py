"""Running this host's workers to completion and tearing them down."""

import signal
import time
from collections.abc import Mapping
from types import FrameType
from typing import BinaryIO

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.launch.caught_signals import caught_signals
from kungfu_tf.run.plan.job_plan import JobPlan
from kungfu_tf.run.providers.job_status import StatusDisplay
from kungfu_tf.run.providers.output import Console
from kungfu_tf.run.providers.worker_process import (
    WorkerProcess,
    describe_exit,
    exit_status,
)

# How long workers get to exit after SIGTERM before they are SIGKILLed.
GRACE_SECONDS = 5.0
# Polling keeps signal handling simple: handlers only record the signal
# and the loop acts within one interval.
POLL_INTERVAL = 0.05
# Bound on waiting for output after exit, in case a grandchild holds a pipe.
OUTPUT_DRAIN_SECONDS = 5.0

class JobSupervisor:
    """Start the local workers, watch them, and stop all on first failure.

    The job's exit status is decided by whatever stops it first: the first
    failing worker's status, or 128+N if the launcher received signal N.
    """

    def __init__(
        self,
        plan: JobPlan,
        console: Console,
        base_env: Mapping[str, str],
        *,
        grace: float = GRACE_SECONDS,
    ):
        """Prepare to run ``plan``; workers inherit ``base_env``."""
        self._plan = plan
        self._console = console
        self._base_env = base_env
        self._grace = grace
        self._workers: list[WorkerProcess] = []
        self._pending_signals: list[int] = []
        self._succeeded = False

    def run(self) -> int:
        """Run the job and return the launcher's exit status."""
        with caught_signals(self._on_signal):
            return self._run()

    def _run(self) -> int:
        try:
            try:
                logs = self._open_logs()
            except LaunchError as e:
                self._console.message(f"error: {e}")
                return 2
            try:
                self._spawn_all(logs)
            except OSError as e:
                self._console.message(
                    f"error: cannot start {self._plan.command[0]!r}: {e.strerror or e}"
                )
                return 127
            status = self._supervise()
            self._succeeded = status == 0
            return status
        finally:
            # Also reached when the launcher itself crashes: never leave
            # workers running without anyone watching them.
            self._teardown()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._pending_signals.append(signum)

    def _open_logs(self) -> list[BinaryIO | None]:
        """One log file per local worker (or None without --logdir), all
        opened before any worker starts so that an unwritable --logdir is
        reported as such, not as a program that cannot start."""
        plan = self._plan
        logs: list[BinaryIO | None] = []
        for peer in plan.local_peers:
            if plan.logdir is None:
                logs.append(None)
                continue
            path = plan.logdir / f"rank-{peer.rank}.log"
            try:
                # Owned by the worker's output relay, which closes it.
                logs.append(open(path, "wb"))  # noqa: SIM115
            except OSError as e:
                for log in logs:
                    if log is not None:
                        log.close()
                raise LaunchError(
                    f"cannot write log file {path} in --logdir {plan.logdir}: "
                    f"{e.strerror or e}"
                ) from None
        return logs

    def _spawn_all(self, logs: list[BinaryIO | None]) -> None:
        plan = self._plan
        try:
            for peer, log in zip(plan.local_peers, logs, strict=True):
                self._workers.append(
                    WorkerProcess(
                        peer,
                        plan.command,
                        plan.worker_env(peer, self._base_env),
                        self._console,
                        echo=not plan.quiet,
                        log=log,
                    )
                )
        except OSError:
            # The logs of workers that never started have no relay to close them.
            for log in logs[len(self._workers) + 1 :]:
                if log is not None:
                    log.close()
            raise
        # Reader threads start only now: forking with a preexec_fn while
        # other threads run risks deadlocks in the child.
        for w in self._workers:
            w.start_output()

    def _supervise(self) -> int:
        running = list(self._workers)
        status: int | None = None
        stopping = False
        kill_at: float | None = None
        display = StatusDisplay(self._console, self._console.status_every)

        def stop(sig: int) -> None:
            nonlocal stopping, kill_at
            stopping = True
            kill_at = time.monotonic() + self._grace
            for w in running:
                w.signal_group(sig)

        while running:
            while self._pending_signals:
                sig = self._pending_signals.pop(0)
                name = signal.Signals(sig).name
                if status is None:
                    status = 128 + sig
                if not stopping:
                    self._console.message(f"received {name}, stopping workers")
                    stop(sig)
                else:
                    # A second Ctrl-C means "now", as users expect.
                    self._console.message(f"received {name} again, killing workers")
                    for w in running:
                        w.signal_group(signal.SIGKILL)

            for w in list(running):
                rc = w.poll()
                if rc is None:
                    continue
                running.remove(w)
                if rc != 0 and not stopping:
                    self._console.message(
                        f"rank {w.peer.rank} ({w.peer.address}) {describe_exit(rc)}"
                    )
                    status = exit_status(rc)
                    stop(signal.SIGTERM)

            if running and kill_at is not None and time.monotonic() >= kill_at:
                self._console.message(
                    f"{len(running)} worker(s) still running {self._grace:g}s "
                    "after SIGTERM, sending SIGKILL"
                )
                for w in running:
                    w.signal_group(signal.SIGKILL)
                kill_at = None

            if running and display.due():
                display.show(len(self._plan.peers))
            if running:
                time.sleep(POLL_INTERVAL)
        display.close()
        return status if status is not None else 0

    def _teardown(self) -> None:
        for w in self._workers:
            if w.poll() is None:
                w.signal_group(signal.SIGKILL)
                w.wait()
        if not self._succeeded:
            # Descendants of workers share their group; sweep them too.
            for w in self._workers:
                w.kill_group()
        for w in self._workers:
            w.finish_output(OUTPUT_DRAIN_SECONDS)
