"""Where the workers of an elastic job run: the seam between the supervisor and its resources.

:class:`~kungfu_tf.run.launch.elastic_supervisor.ElasticSupervisor` decides what
happens to the cluster (commits, losses, joiners, the job's end); a
:class:`WorkerProvider` decides where a worker's process runs and how it is
reached:

* :class:`LocalProcesses` (``kungfu-run --elastic``): child processes of
  this launcher, joiners placed on the ``-H`` hosts' slots;
* :class:`~kungfu_tf.run.providers.ray_provider.RayActors` (``kungfu-run --ray``):
  each worker a subprocess of one Ray actor in its own placement group,
  joiners placed by Ray's scheduler and autoscaler.

Example::

    supervisor = ElasticSupervisor(plan, console, os.environ, provider=LocalProcesses())
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import BinaryIO, Protocol

from kungfu_tf.run.control.config_server import ConfigClient
from kungfu_tf.run.plan.elastic_plan import ElasticPlan
from kungfu_tf.run.providers.joiner_scheduler import JoinerScheduler, SupervisorHooks
from kungfu_tf.run.providers.output import Console
from kungfu_tf.run.providers.worker_process import WorkerProcess
from kungfu_tf.run.worker_env.placement import Peer


class WorkerHandle(Protocol):
    """One started worker, as the supervisor drives it (WorkerProcess's interface)."""

    peer: Peer

    def start_output(self) -> None:
        """Begin relaying the worker's output."""

    def poll(self) -> int | None:
        """Popen-style return code, or None while it runs."""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker and its children."""

    def kill_group(self) -> None:
        """SIGKILL whatever is left of the worker (teardown)."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker to end; its return code."""

    def finish_output(self, timeout: float) -> None:
        """Relay the rest of the output (bounded)."""


class JoinerPlanner(Protocol):
    """What places joiners for the serving launcher (JoinerScheduler's interface)."""

    gave_up: bool

    def note(self, state, ever_members: set[str], joiner_end: Mapping[str, str]) -> None:
        """Take in a new JobState."""

    def place(self, state, running_peers) -> None:
        """Place joiners until the target size is covered."""

    def poll_hosts(self) -> None:
        """Apply host changes (discovery)."""

    def stop(self) -> None:
        """Stop background work."""


class WorkerProvider(Protocol):
    """Starts workers and places joiners for one elastic job."""

    def runs_here(self, host: str, self_host: str) -> bool:
        """Whether this launcher starts the workers placed on ``host``."""

    def joiner_planner(
        self, plan: ElasticPlan, client: ConfigClient, console: Console, hooks: SupervisorHooks
    ) -> JoinerPlanner:
        """The serving launcher's joiner placement."""

    def start_worker(
        self,
        peer: Peer,
        command: Sequence[str],
        env: Mapping[str, str],
        console: Console,
        *,
        echo: bool,
        log: BinaryIO | None,
    ) -> WorkerHandle:
        """Start ``command`` as ``peer``; raises OSError if it cannot be started."""

    def release(self, worker: WorkerHandle) -> None:
        """The worker ended and its exit was judged: give back what it held."""

    def close(self) -> None:
        """Every worker is gone: give back everything (called once, at teardown)."""


class LocalProcesses:
    """Workers are child processes of this launcher (``kungfu-run --elastic``)."""

    def runs_here(self, host: str, self_host: str) -> bool:
        """This launcher starts the workers of its own host."""
        return host == self_host

    def joiner_planner(
        self, plan: ElasticPlan, client: ConfigClient, console: Console, hooks: SupervisorHooks
    ) -> JoinerPlanner:
        """Slots of the ``-H`` hosts (or the discovery script's)."""
        return JoinerScheduler(plan, client, console, hooks)

    def start_worker(
        self,
        peer: Peer,
        command: Sequence[str],
        env: Mapping[str, str],
        console: Console,
        *,
        echo: bool,
        log: BinaryIO | None,
    ) -> WorkerHandle:
        """A child process in its own process group."""
        return WorkerProcess(peer, command, env, console, echo=echo, log=log)

    def release(self, worker: WorkerHandle) -> None:
        """A reaped process holds nothing."""

    def close(self) -> None:
        """Nothing to give back."""
