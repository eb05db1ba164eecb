"""Workers as Ray actors (``kungfu-run --ray ADDRESS``): the Ray side of :mod:`kungfu_tf.run.providers.worker_provider`.

Each worker gets a *slot*: a placement group of one bundle (``{"CPU":
cpus_per_worker}``) and one :class:`~kungfu_tf.run.providers.ray_worker_actor.WorkerActor`
in it. Once Ray placed the actor, it reports its node id and a free port
there; the slot is known by its peer ``host:port`` from then on (fake nodes
of Ray's test clusters share one IP, so the port and node id tell them
apart). The actor then runs the worker as a plain subprocess: Ray is never
imported into the TF worker.

* Ray's autoscaler is always asked for one bundle per slot
  (``ray.autoscaler.sdk.request_resources``): a slot created for a joiner
  raises the request (a node appears if the cluster can grow), a slot
  released lowers it again.
* A worker's exit is judged by the supervisor as a local process's is; only
  then is its slot released (actor killed, placement group removed, request
  lowered): a member that shrank away has left the cluster first.
* A dead actor (killed, or its node gone) is a worker killed by SIGKILL: a
  crashed member, reported lost and, with ``--elastic``, replaced by a joiner
  in a new slot wherever Ray finds room.

Example::

    ray_module = import_ray()
    connect(ray_module, "127.0.0.1:6379")
    provider = RayActors(ray_module, Console())
    peers = provider.start_initial(2, timeout=60)
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import grpc

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import ConfigClient, cluster_peers
from kungfu_tf.run.control.membership_change import workers_text
from kungfu_tf.run.control.rpc_errors import rpc_error_text
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.elastic_plan import ElasticPlan
from kungfu_tf.run.providers.joiner_scheduler import (
    MAX_JOINER_FAILURES,
    JoinerScheduler,
    SupervisorHooks,
    joiner_peers,
)
from kungfu_tf.run.providers.output import Console, OutputRelay
from kungfu_tf.run.providers.ray_worker_actor import STDERR, WorkerActor
from kungfu_tf.run.worker_env.placement import Peer

RAY_INSTALL_HINT = "pip install kungfu_tf[ray]"
# How long a TCP connect to --ray HOST:PORT may take before it is unreachable.
REACH_TIMEOUT_SECONDS = 5.0
# How often a worker's actor is asked for its output and exit.
PROGRESS_INTERVAL = 0.1
# Bound on an actor call that should return at once (start, teardown).
ACTOR_CALL_TIMEOUT = 60.0
# Teardown: how long a worker's actor may take to report the end of a
# SIGKILLed worker before the actor itself is killed.
WAIT_BEFORE_ACTOR_KILL = 10.0
# The return code of a worker whose actor (or node) died: killed by SIGKILL.
ACTOR_DIED_RETURNCODE = -int(signal.SIGKILL)

Joiner = config_pb2.Joiner


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        LaunchError: Ray is not installed, naming the extra that installs it.
    """
    try:
        import ray
    except ImportError as e:
        raise LaunchError(
            f"--ray needs Ray Core, which is not installed here ({e}): {RAY_INSTALL_HINT}"
        ) from None
    return ray


def connect(ray: Any, address: str) -> None:
    """Join the Ray cluster at ``address`` as a driver (``auto``: the one started on this machine).

    Raises:
        LaunchError: nothing listens at ``address`` (said within
            :data:`REACH_TIMEOUT_SECONDS`, not after Ray's own minute of
            retries), or Ray refuses the connection.
    """
    if address != "auto":
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise LaunchError(
                f"bad --ray {address!r}: expected HOST:PORT of the Ray cluster's head (GCS), or auto"
            )
        try:
            with socket.create_connection(
                (host, int(port)), timeout=REACH_TIMEOUT_SECONDS
            ):
                pass
        except OSError as e:
            raise LaunchError(
                f"cannot reach the Ray cluster at --ray {address}: {e.strerror or e} "
                "(is `ray start --head` running there? the address is the head's GCS HOST:PORT)"
            ) from None
    try:
        ray.init(
            address=address,
            log_to_driver=False,
            logging_level="WARNING",
            configure_logging=False,
        )
    except Exception as e:  # noqa: BLE001 - Ray raises many kinds; all mean "not connected"
        raise LaunchError(
            f"cannot connect to the Ray cluster at --ray {address}: {type(e).__name__}: {e}"
        ) from None


@dataclass
class _Slot:
    """A placement group with one WorkerActor; ``address`` once the actor reported it."""

    actor: Any
    group: Any
    address_ref: Any
    created_at: float
    node_id: str = ""
    address: str = ""
    started: bool = False
    relayed: dict[str, Any] = field(default_factory=dict)


class RayActors:
    """Workers as subprocesses of Ray actors, one placement group each.

    Example::

        provider = RayActors(ray, console, cpus_per_worker=1)
        peers = provider.start_initial(np, timeout=60)
        ElasticSupervisor(plan, console, env, provider=provider).run()  # closes it
    """

    def __init__(self, ray: Any, console: Console, *, cpus_per_worker: float = 1.0):
        """Use the connected ``ray``; every worker's bundle is ``{"CPU": cpus_per_worker}``."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._ray = ray
        self._console = console
        self._cpus = cpus_per_worker
        self._strategy = PlacementGroupSchedulingStrategy
        self._actor_class = ray.remote(WorkerActor)
        self._slots: list[_Slot] = []  # creation order; placed ones have an address
        self._requested = -1
        self._closed = False

    @property
    def bundle(self) -> dict[str, float]:
        """The resources of one worker's placement group."""
        return {"CPU": self._cpus}

    # ------------------------------------------------------------- slots

    def new_slot(self) -> _Slot:
        """Ask Ray for one more worker: a placement group, its actor, and the autoscaler request."""
        from ray.util.placement_group import placement_group

        group = placement_group([self.bundle], strategy="STRICT_PACK")
        actor = self._actor_class.options(
            num_cpus=self._cpus,
            max_restarts=0,
            scheduling_strategy=self._strategy(
                placement_group=group, placement_group_bundle_index=0
            ),
        ).remote()
        slot = _Slot(actor, group, actor.address.remote(), time.monotonic())
        self._slots.append(slot)
        self._request()
        return slot

    def take_placed(self, slots: Sequence[_Slot]) -> list[_Slot]:
        """Those of ``slots`` whose actor reported its address now (without waiting)."""
        waiting = [s for s in slots if not s.address]
        if not waiting:
            return []
        ready, _ = self._ray.wait(
            [s.address_ref for s in waiting], num_returns=len(waiting), timeout=0
        )
        placed = []
        for s in waiting:
            if s.address_ref in ready:
                try:
                    node_id, host, port = self._ray.get(s.address_ref)
                except self._ray.exceptions.RayError as e:
                    self._console.message(
                        f"a Ray actor for a worker died before it was placed: {_short(e)}"
                    )
                    self.drop(s)
                    continue
                s.node_id, s.address = node_id, f"{host}:{port}"
                placed.append(s)
        return placed

    def unplaced(self) -> list[_Slot]:
        """Slots whose actor Ray has not placed yet."""
        return [s for s in self._slots if not s.address]

    def drop(self, slot: _Slot) -> None:
        """Kill the slot's actor, remove its placement group, lower the request."""
        if slot not in self._slots:
            return
        self._slots.remove(slot)
        self._free(slot)
        self._request()

    def drop_unstarted(self, wanted: set[str]) -> None:
        """Drop placed slots whose worker never started and whose address is no longer wanted."""
        for s in [
            s
            for s in self._slots
            if s.address and not s.started and s.address not in wanted
        ]:
            self.drop(s)

    def start_initial(self, np: int, timeout: float) -> list[Peer]:
        """Create ``np`` slots and wait until Ray placed all of them; the peers, rank = creation order.

        Raises:
            LaunchError: not all were placed within ``timeout`` seconds.
        """
        slots = [self.new_slot() for _ in range(np)]
        deadline = time.monotonic() + timeout
        while any(not s.address for s in slots):
            if any(s not in self._slots for s in slots):
                raise LaunchError(
                    "a Ray actor for an initial worker died before it was placed"
                )
            if time.monotonic() >= deadline:
                placed = sum(1 for s in slots if s.address)
                raise LaunchError(
                    f"Ray placed only {placed} of {np} workers (bundle {self.bundle} each) within "
                    f"--timeout {timeout:g} s; the cluster has {self._ray.cluster_resources()} in all, "
                    f"{self._ray.available_resources()} free"
                )
            self.take_placed(slots)
            time.sleep(0.05)
        peers = []
        for rank, s in enumerate(slots):
            host, _, port = s.address.rpartition(":")
            peers.append(Peer(rank, host, int(port)))
        return peers

    def _request(self) -> None:
        """Tell the autoscaler the job wants one bundle per slot (no call when unchanged)."""
        if self._closed or len(self._slots) == self._requested:
            return
        from ray.autoscaler.sdk import request_resources

        self._requested = len(self._slots)
        try:
            request_resources(bundles=[self.bundle] * self._requested)
        except Exception as e:  # noqa: BLE001 - best effort: a cluster without autoscaler
            self._console.message(
                f"cannot ask the Ray autoscaler for {self._requested} bundles: {_short(e)}"
            )

    def _free(self, slot: _Slot) -> None:
        from ray.util.placement_group import remove_placement_group

        for action in (
            lambda: self._ray.kill(slot.actor),
            lambda: remove_placement_group(slot.group),
        ):
            try:
                action()
            except Exception:  # noqa: BLE001, S110 - its node may be gone already: nothing left to free
                pass

    def slot_of(self, address: str) -> _Slot | None:
        """The slot whose actor reported ``address``."""
        return next((s for s in self._slots if s.address == address), None)

    # ------------------------------------------------ WorkerProvider

    def runs_here(self, host: str, self_host: str) -> bool:
        """This launcher starts every worker (on whichever node Ray placed it)."""
        return True

    def joiner_planner(
        self,
        plan: ElasticPlan,
        client: ConfigClient,
        console: Console,
        hooks: SupervisorHooks,
    ) -> RayJoinerPlanner:
        """Joiners in new slots, added once Ray placed them."""
        return RayJoinerPlanner(plan, client, console, hooks, self)

    def start_worker(
        self,
        peer: Peer,
        command: Sequence[str],
        env: Mapping[str, str],
        console: Console,
        *,
        echo: bool,
        log: BinaryIO | None,
    ) -> RayWorker:
        """Start the worker in the slot placed at ``peer``; OSError if that fails."""
        slot = self.slot_of(peer.address)
        try:
            if slot is None:
                raise OSError(f"no Ray actor was placed at {peer.address}")
            try:
                self._ray.get(
                    slot.actor.start.remote(list(command), dict(env)),
                    timeout=ACTOR_CALL_TIMEOUT,
                )
            except self._ray.exceptions.RayTaskError as e:
                cause = e.as_instanceof_cause()
                raise OSError(f"on Ray node {slot.node_id}: {cause}") from None
            except self._ray.exceptions.RayError as e:
                raise OSError(f"its Ray actor failed: {_short(e)}") from None
        except OSError:
            if log is not None:
                log.close()
            raise
        slot.started = True
        return RayWorker(self._ray, slot, peer, console, echo=echo, log=log)

    def release(self, worker: Any) -> None:
        """The worker's exit was judged: its actor and placement group go, the request drops."""
        slot = self.slot_of(worker.peer.address)
        if slot is not None:
            self.drop(slot)
            self._console.event(
                f"released the Ray actor and placement group of {slot.address} "
                f"(asking Ray for {len(self._slots)} bundle(s) now)"
            )

    def close(self) -> None:
        """Kill every actor, remove every placement group, withdraw the request, leave Ray."""
        if self._closed:
            return
        for s in list(self._slots):
            self._free(s)
        self._slots.clear()
        self._request()
        self._closed = True
        try:
            from ray.autoscaler.sdk import request_resources

            request_resources(bundles=[])
        except Exception:  # noqa: BLE001, S110 - the cluster may be gone already
            pass
        self._ray.shutdown()


class RayWorker:
    """A worker running as a Ray actor's subprocess, driven like a WorkerProcess.

    Its output comes from the actor every :data:`PROGRESS_INTERVAL` seconds
    (when the supervisor polls) and is relayed through pipes by an
    :class:`OutputRelay`, so it is printed and logged as a local worker's.
    """

    def __init__(
        self,
        ray: Any,
        slot: _Slot,
        peer: Peer,
        console: Console,
        *,
        echo: bool,
        log: BinaryIO | None,
    ):
        """Relay ``slot``'s worker as ``peer``."""
        self.peer = peer
        self.exit_reason: str | None = None
        self._ray = ray
        self._slot = slot
        self._console = console
        self._returncode: int | None = None
        self._pending: Any = None
        self._next_at = 0.0
        out_r, self._out_w = os.pipe()
        err_r, self._err_w = os.pipe()
        self._relay = OutputRelay(
            peer.rank,
            os.fdopen(out_r, "rb"),
            os.fdopen(err_r, "rb"),
            console,
            echo=echo,
            log=log,
        )

    @property
    def node_id(self) -> str:
        """The Ray node the worker runs on."""
        return self._slot.node_id

    def start_output(self) -> None:
        """Start relaying."""
        self._relay.start()

    def poll(self) -> int | None:
        """Relay new output; the return code once the worker ended (its actor's death: SIGKILL)."""
        if self._returncode is not None:
            return self._returncode
        now = time.monotonic()
        if self._pending is None:
            if now < self._next_at:
                return None
            self._pending = self._slot.actor.progress.remote()
            self._next_at = now + PROGRESS_INTERVAL
        ready, _ = self._ray.wait([self._pending], timeout=0)
        if not ready:
            return None
        ref, self._pending = self._pending, None
        try:
            chunks, returncode = self._ray.get(ref)
        except self._ray.exceptions.RayError as e:
            self.exit_reason = "its Ray actor or node died"
            self._console.message(
                f"the Ray actor of worker [{self.peer.rank}] {self.peer.address} on node {self._slot.node_id} "
                f"died: {_short(e)}"
            )
            chunks, returncode = [], ACTOR_DIED_RETURNCODE
        for stream, line in chunks:
            self._write(self._err_w if stream == STDERR else self._out_w, line)
        if returncode is not None:
            self._returncode = returncode
            self._close_pipes()
        return self._returncode

    def signal_group(self, sig: int) -> None:
        """Have the actor signal the worker's process group."""
        if self._returncode is None:
            self._slot.actor.signal_group.remote(int(sig))

    def kill_group(self) -> None:
        """Have the actor SIGKILL what is left of the group."""
        self._slot.actor.kill_group.remote()

    def wait(self, timeout: float | None = None) -> int:
        """Poll until the worker ended; an actor that does not say so in time is killed (its worker dies with it).

        Raises:
            TimeoutError: still running after ``timeout`` seconds.
        """
        start = time.monotonic()
        killed = False
        while (rc := self.poll()) is None:
            waited = time.monotonic() - start
            if timeout is not None and waited >= timeout:
                raise TimeoutError(
                    f"worker {self.peer.address} still running after {timeout:g} s"
                )
            if not killed and waited >= WAIT_BEFORE_ACTOR_KILL:
                killed = True
                try:
                    self._ray.kill(self._slot.actor)
                except Exception:  # noqa: BLE001, S110 - gone already: the next poll says so
                    pass
            time.sleep(0.02)
        return rc

    def finish_output(self, timeout: float) -> None:
        """Relay what the actor still held, then wait (bounded) for the relay."""
        self._close_pipes()
        self._relay.join(timeout)

    def _write(self, fd: int, data: bytes) -> None:
        if fd < 0:
            return
        try:
            os.write(fd, data)
        except OSError:
            pass

    def _close_pipes(self) -> None:
        for name in ("_out_w", "_err_w"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


class RayJoinerPlanner(JoinerScheduler):
    """The serving launcher's joiners on Ray: a new slot per missing worker, added once placed.

    While the cluster plus its joiners plus the slots Ray has not placed yet
    is smaller than the target size (and ``--max-np``), another slot is
    created (raising the autoscaler's request); a slot Ray placed becomes a
    joiner (AddJoiner at the address its actor reported), which the
    supervisor starts and the workers admit when it is READY. Fewer wanted:
    unplaced slots go first, then the newest joiners. A slot that Ray does
    not place within ``--join-timeout`` is given up and counts as a failed
    joiner. Failure counting and late joiners are the JoinerScheduler's.
    """

    def __init__(
        self,
        plan: ElasticPlan,
        client: ConfigClient,
        console: Console,
        hooks: SupervisorHooks,
        provider: RayActors,
    ):
        """Place joiners with ``provider``'s slots."""
        super().__init__(plan, client, console, hooks)
        self._provider = provider

    def poll_hosts(self) -> None:
        """Ray knows its nodes: nothing to discover."""

    def place(self, state: config_pb2.JobState, running_peers) -> None:
        """Turn placed slots into joiners, create or drop slots to meet the target."""
        provider = self._provider
        wanted = set(cluster_peers(state.cluster)) | set(joiner_peers(state))
        provider.drop_unstarted(wanted | set(running_peers))
        if self.gave_up:
            for s in provider.unplaced():
                provider.drop(s)
            return
        if self._withdraw_late(state):
            return
        unplaced = provider.unplaced()
        self._give_up_late_slots(unplaced)
        target = min(state.target_size, self._plan.max_np)
        have = len(state.cluster.workers) + len(state.joiners)
        for slot in provider.take_placed(unplaced):
            if have >= target:
                provider.drop(slot)
                continue
            try:
                self._hooks.observe(self._client.add_joiner(slot.address))
            except grpc.RpcError as e:
                self._console.message(
                    f"cannot add joiner {slot.address}: {rpc_error_text(e)}"
                )
                provider.drop(slot)
                continue
            have += 1
            self._placed.add(slot.address)
            self._placed_at[slot.address] = time.monotonic()
            self._console.event(
                f"placed joiner {slot.address} on Ray node {slot.node_id} (target {workers_text(target)})"
            )
        unplaced = provider.unplaced()
        missing = target - have - len(unplaced)
        if missing > 0:
            for _ in range(missing):
                provider.new_slot()
            self._console.event(
                f"asked Ray for {workers_text(missing)} more (bundle {provider.bundle} each; target {workers_text(target)})"
            )
        elif missing < 0:
            for slot in unplaced[::-1][:-missing]:
                provider.drop(slot)
            surplus = have - target
            if surplus > 0:
                withdrawable = joiner_peers(state, Joiner.STARTING, Joiner.READY)
                for peer in reversed(
                    withdrawable[max(0, len(withdrawable) - surplus) :]
                ):
                    self._placed.discard(peer)
                    self._placed_at.pop(peer, None)
                    self._hooks.remove_joiner(peer)

    def _give_up_late_slots(self, unplaced: list[_Slot]) -> None:
        limit = self._plan.join_timeout
        now = time.monotonic()
        for slot in unplaced:
            if now - slot.created_at >= limit:
                self._console.message(
                    f"Ray did not place a worker (bundle {self._provider.bundle}) within --join-timeout {limit:g} s; "
                    "giving that joiner up"
                )
                self._provider.drop(slot)
                self._failures += 1
                if self._failures >= MAX_JOINER_FAILURES and not self.gave_up:
                    self.gave_up = True
                    self._console.message(
                        f"giving up on starting joiners: {self._failures} in a row were not admitted"
                    )


def _short(error: BaseException) -> str:
    """The first line of an error, bounded (Ray's carry whole tracebacks)."""
    text = str(error).strip().splitlines()
    first = text[0] if text else type(error).__name__
    return first if len(first) <= 200 else first[:197] + "..."
