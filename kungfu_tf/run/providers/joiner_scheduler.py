"""What only the serving launcher of an elastic job decides.

Every launcher starts the workers placed on its own host; one of them (the
one that serves the config service) decides for all, so that two launchers
never disagree:

* where joiners run: while the cluster plus the joiners in flight is smaller
  than the target size (and ``--max-np``), the next joiner goes to the first
  host with a free slot, on a port no worker of the job used; AddJoiner
  carries that placement to the launcher of its host;
* when a joiner takes too long: one still STARTING ``--join-timeout``
  seconds after it was placed (its host's launcher never started it, or
  its warm-up hangs) is withdrawn (RemoveJoiner: the launcher of its host
  stops it) and another is placed;
* when to stop trying: after :data:`MAX_JOINER_FAILURES` joiners in a row
  ended without being admitted (a different model, a crash or a timeout
  while warming up), no further joiner is placed and the job goes on as it
  is;
* which workers leave with their host: when ``--host-discovery-script``
  stops listing a host, a cluster without its workers is committed
  (PutCluster; they detach) and its joiners are withdrawn; with
  ``--elastic`` the target size is restored so replacements are placed
  where slots are free.

Example::

    scheduler = JoinerScheduler(plan, client, console, hooks)
    scheduler.note(state, ever_members, joiner_end)   # each new JobState
    scheduler.poll_hosts(); scheduler.place(state, running_peers)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import grpc

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import (
    ConfigClient,
    cluster_peers,
    make_cluster,
    peer_string,
)
from kungfu_tf.run.control.membership_change import workers_text
from kungfu_tf.run.control.rpc_errors import rpc_error_text
from kungfu_tf.run.plan.elastic_plan import ElasticPlan
from kungfu_tf.run.plan.host_discovery import HostDiscovery
from kungfu_tf.run.providers.joiner_placement import JoinerPlacer, NoPortLeft
from kungfu_tf.run.providers.output import Console
from kungfu_tf.run.worker_env.placement import HostSlots

# Joiners in a row that may end without being admitted before no more are
# placed: a joiner that keeps failing would otherwise be restarted for ever.
MAX_JOINER_FAILURES = 3
# How long joiners wait for a free slot before the launcher says so.
NO_SLOT_REPORT_SECONDS = 2.0
# Attempts at a PutCluster that raced with another change.
CAS_ATTEMPTS = 5

Joiner = config_pb2.Joiner


def joiner_peers(state: config_pb2.JobState, *states: int) -> list[str]:
    """The joiners of ``state`` as "host:port" (only those in ``states`` if given)."""
    return [peer_string(j.peer) for j in state.joiners if not states or j.state in states]


def _host_of(peer: str) -> str:
    return peer.rpartition(":")[0]


@dataclass(frozen=True)
class SupervisorHooks:
    """What the scheduler asks of the supervisor that owns the job's view.

    ``observe`` takes in a JobState an RPC answered (prints its changes);
    ``fresh_state`` reads the state now; ``remove_joiner`` forgets a joiner
    (RemoveJoiner, a gone one is fine); ``fail`` ends the job with a message.
    """

    observe: Callable[[config_pb2.JobState], None]
    fresh_state: Callable[[], config_pb2.JobState | None]
    remove_joiner: Callable[[str], None]
    fail: Callable[[str], None]


class JoinerScheduler:
    """Joiner placement, giving up on failing joiners, and host discovery."""

    def __init__(self, plan: ElasticPlan, client: ConfigClient, console: Console, hooks: SupervisorHooks):
        """Place joiners on ``plan.hosts``; start polling the discovery script if there is one."""
        self._plan = plan
        self._client = client
        self._console = console
        self._hooks = hooks
        self._hosts: list[HostSlots] = list(plan.hosts)
        self._placer = JoinerPlacer(plan.port_range, plan.self_host)
        for p in plan.initial_peers:
            self._placer.note_used(p.host, p.port)
        self._placed: set[str] = set()
        # When each placed joiner was placed (for --join-timeout), and why
        # the scheduler itself ended some (withdrawn ones).
        self._placed_at: dict[str, float] = {}
        self._withdrawn: dict[str, str] = {}
        self._failures = 0
        self.gave_up = False
        # With a config store: the hosts whose launcher's lease lives (a
        # joiner placed on a dead launcher's host would never start); None: all.
        self.live_hosts: set[str] | None = None
        # Since when no slot was free (None: one was), and whether it was said.
        self._no_slot_since: float | None = None
        self._no_slot_reported = False
        self._discovery = (
            HostDiscovery(plan.discovery_script, plan.hosts) if plan.discovery_script is not None else None
        )

    def stop(self) -> None:
        """Stop polling the discovery script."""
        if self._discovery is not None:
            self._discovery.stop()

    # ------------------------------------------------------------ outcomes

    def note(self, state: config_pb2.JobState, ever_members: set[str], joiner_end: Mapping[str, str]) -> None:
        """Take in a new JobState: ports in use, and which placed joiners are gone.

        ``ever_members``: every worker that was a member of some version;
        ``joiner_end``: why joiners ended, as far as the supervisor knows.
        """
        for w in state.cluster.workers:
            self._placer.note_used(w.host, w.port)
        for j in state.joiners:
            self._placer.note_used(j.peer.host, j.peer.port)
        members, joiners = set(cluster_peers(state.cluster)), set(joiner_peers(state))
        for peer in sorted(self._placed - joiners):
            self._placed.discard(peer)
            self._placed_at.pop(peer, None)
            why = self._withdrawn.pop(peer, None) or joiner_end.get(peer, "ended")
            if peer in members or peer in ever_members:
                self._failures = 0
                continue
            self._failures += 1
            if self._failures >= MAX_JOINER_FAILURES and not self.gave_up:
                self.gave_up = True
                self._console.message(
                    f"giving up on starting joiners: {self._failures} in a row ended before they were "
                    f"admitted (the last, {peer}: {why}); "
                    f"the job goes on with {workers_text(len(members))}"
                )

    # ----------------------------------------------------------- placement

    def place(self, state: config_pb2.JobState, running_peers: Iterable[str]) -> None:
        """Place joiners until the target size is covered; withdraw surplus ones.

        ``running_peers``: this host's processes that still run (a dead
        member holds its slot until it is reaped and reported).
        """
        if self.gave_up:
            return
        if self._withdraw_late(state):
            return  # placed again with the state that follows the withdrawal
        # A REJECTED joiner counts until its process is gone: it still holds a slot.
        target = min(state.target_size, self._plan.max_np)
        missing = target - len(state.cluster.workers) - len(state.joiners)
        if missing < 0:
            # More joiners than needed (the target was lowered): withdraw the newest.
            withdrawable = joiner_peers(state, Joiner.STARTING, Joiner.READY)
            for peer in reversed(withdrawable[max(0, len(withdrawable) + missing) :]):
                self._placed.discard(peer)
                self._placed_at.pop(peer, None)
                self._hooks.remove_joiner(peer)
            return
        occupied = self._occupied(state, running_peers)
        for _ in range(missing):
            try:
                placement = self._placer.place(self._usable_hosts(), occupied)
            except NoPortLeft as e:
                self._console.message(f"cannot place a joiner: {e}")
                self.gave_up = True
                return
            if placement is None:
                self._say_no_slot(target)
                return
            self._no_slot_since, self._no_slot_reported = None, False
            host, port = placement
            peer = f"{host}:{port}"
            try:
                self._hooks.observe(self._client.add_joiner(peer))
            except grpc.RpcError as e:
                self._console.message(f"cannot add joiner {peer}: {rpc_error_text(e)}")
                return
            self._placed.add(peer)
            self._placed_at[peer] = time.monotonic()
            occupied[host] = occupied.get(host, 0) + 1
            if host != self._plan.self_host:
                # Its own launcher prints "started joiner" on that host.
                self._console.event(f"placed joiner {peer} (target {workers_text(target)})")

    def _usable_hosts(self) -> list[HostSlots]:
        """The hosts joiners may go to: with a config store, only those whose launcher lives."""
        if self.live_hosts is None:
            return self._hosts
        return [h for h in self._hosts if h.host in self.live_hosts]

    def _withdraw_late(self, state: config_pb2.JobState) -> bool:
        """Withdraw placed joiners still STARTING after --join-timeout; whether there were any.

        A joiner that never gets READY would hold its place toward the
        target for ever. Each one withdrawn counts as a failed joiner (see
        :meth:`note`), so a joiner that can never warm up is not retried for ever.
        """
        limit = self._plan.join_timeout
        now = time.monotonic()
        late = [
            peer
            for peer in joiner_peers(state, Joiner.STARTING)
            if peer in self._placed_at and now - self._placed_at[peer] >= limit
        ]
        for peer in late:
            self._withdrawn[peer] = f"still STARTING after --join-timeout {limit:g} s"
            self._console.message(
                f"withdrawing joiner {peer}: still STARTING {limit:g} s after it was placed "
                f"(--join-timeout {limit:g}): its launcher did not start it or its warm-up hangs"
            )
            self._hooks.remove_joiner(peer)
        return bool(late)

    def _say_no_slot(self, target: int) -> None:
        # A crashed worker holds its slot until it is reaped: only a wait
        # that lasts is worth a message.
        now = time.monotonic()
        self._no_slot_since = self._no_slot_since or now
        if not self._no_slot_reported and now - self._no_slot_since >= NO_SLOT_REPORT_SECONDS:
            self._no_slot_reported = True
            slots = ",".join(f"{h.host}:{h.slots}" for h in self._hosts)
            self._console.message(f"no free slot for a joiner (target {target} workers, hosts {slots}); waiting for one")

    @staticmethod
    def _occupied(state: config_pb2.JobState, running_peers: Iterable[str]) -> dict[str, int]:
        """Workers per host: members, joiners, and local processes still alive."""
        peers = set(cluster_peers(state.cluster)) | set(joiner_peers(state)) | set(running_peers)
        occupied: dict[str, int] = {}
        for p in peers:
            occupied[_host_of(p)] = occupied.get(_host_of(p), 0) + 1
        return occupied

    # ------------------------------------------------------ host discovery

    def poll_hosts(self) -> None:
        """Apply what the discovery script printed since the last call."""
        if self._discovery is None:
            return
        outcome = self._discovery.take()
        if outcome is None:
            return
        if isinstance(outcome, str):
            self._console.message(outcome)
            return
        if outcome == self._hosts:
            return
        old, new = {h.host for h in self._hosts}, {h.host for h in outcome}
        removed, added = sorted(old - new), sorted(new - old)
        parts = ([f"added {', '.join(added)}"] if added else []) + ([f"removed {', '.join(removed)}"] if removed else [])
        listing = ",".join(f"{h.host}:{h.slots}" for h in outcome)
        self._console.event(f"hosts: {listing} ({'; '.join(parts) or 'slots changed'})")
        self._hosts = list(outcome)
        self._no_slot_since, self._no_slot_reported = None, False
        if removed:
            self._evict_hosts(set(removed))

    def _evict_hosts(self, removed: set[str]) -> None:
        """Commit a cluster without the removed hosts' workers; withdraw their joiners."""
        names = ", ".join(sorted(removed))
        state = self._hooks.fresh_state()
        if state is None:
            return
        target_before = state.target_size
        for _ in range(CAS_ATTEMPTS):
            keep = [w for w in state.cluster.workers if w.host not in removed]
            if len(keep) == len(state.cluster.workers):
                break
            if len(keep) < self._plan.min_np:
                self._hooks.fail(
                    f"cluster fell to {workers_text(len(keep))}, below --min-np {self._plan.min_np} "
                    f"(hosts {names} removed by --host-discovery-script)"
                )
                return
            try:
                self._client.put_cluster(make_cluster(state.cluster.version + 1, keep))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    self._console.message(f"cannot evict the workers of {names}: {rpc_error_text(e)}")
                    return
            state = self._hooks.fresh_state()
            if state is None:
                return
        for j in state.joiners:
            if j.peer.host in removed:
                address = peer_string(j.peer)
                self._placed.discard(address)
                self._placed_at.pop(address, None)
                self._hooks.remove_joiner(address)
        # PutCluster lowered the target; crashed-worker replacement covers
        # hosts that went away as well.
        if self._plan.replace_crashed and target_before > len(state.cluster.workers):
            try:
                self._hooks.observe(self._client.request_size(target_before))
            except grpc.RpcError as e:
                self._console.message(f"cannot restore the target size {target_before}: {rpc_error_text(e)}")
