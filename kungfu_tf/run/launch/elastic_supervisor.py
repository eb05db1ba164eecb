"""Running this host's workers of an elastic job while its cluster changes.

KungFu's watch mode (``kungfu-run --elastic``/``--min-np``). The launcher
that serves the config service commits the initial workers as cluster
version 1; every launcher starts the members of version 1 placed on its
host, then follows the job's state (a long poll of WaitJobState) and its own
processes:

* a member that exits 0 has finished: its launcher reports it
  (ReportFinished), so that every launcher knows, whichever host it ran on.
  Once one member finished the job is ending: joiners still warming up are
  stopped and none is placed. The job ends when every member of the current
  cluster has finished (on every host): then every launcher ends, the
  serving one last of its host's processes but not before the others'
  members are done (it serves the config service they still use);
* a worker that exits 0 and is no longer a member detached (a resize);
* a member that dies otherwise is reported lost (ReportLost; its peers may
  have reported it first) and, with ``--elastic``, replaced: the config
  service keeps the target size, so a joiner is placed for it;
* joiners are placed by the serving launcher (kungfu_tf/run/providers/joiner_scheduler.py:
  slots, ``--max-np``, giving up on joiners that keep failing, host
  discovery); the launcher of the joiner's host starts it
  (``KUNGFU_JOINER=1``, a one-worker cluster at version 0);
* a joiner that dies is forgotten (RemoveJoiner), a REJECTED one's reason
  is printed; one still STARTING ``--join-timeout`` seconds after it was
  placed is withdrawn (and stopped by the launcher of its host);
* fewer members than ``--min-np`` stops every worker and fails the job.

Every committed version is printed as one line, e.g.
``[kungfu-run] cluster v3: 4 -> 3 workers (lost 127.0.0.1:10002: killed by SIGKILL)``.
SIGINT/SIGTERM stop everything as in a job of fixed size.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, BinaryIO

import grpc

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import (
    ConfigClient,
    ConfigServer,
    cluster_peers,
    make_cluster,
    parse_peer_string,
    peer_string,
)
from kungfu_tf.run.control.job_state import JobStateMachine, job_finished
from kungfu_tf.run.control.job_store import StoreUnavailableError
from kungfu_tf.run.control.job_watcher import JobWatcher
from kungfu_tf.run.control.membership_change import describe_change, workers_text
from kungfu_tf.run.control.rpc_errors import rpc_error_text
from kungfu_tf.run.control.stored_job_state import StoredJobStateMachine
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.launch.caught_signals import caught_signals
from kungfu_tf.run.launch.config_service_port import start_avoiding
from kungfu_tf.run.launch.supervisor import (
    GRACE_SECONDS,
    OUTPUT_DRAIN_SECONDS,
    POLL_INTERVAL,
)
from kungfu_tf.run.plan.elastic_plan import ElasticPlan
from kungfu_tf.run.providers.job_status import StatusDisplay
from kungfu_tf.run.providers.joiner_scheduler import (
    JoinerScheduler,
    SupervisorHooks,
    joiner_peers,
)
from kungfu_tf.run.providers.output import Console
from kungfu_tf.run.providers.worker_process import (
    describe_exit,
    exit_cause,
    exit_status,
)
from kungfu_tf.run.providers.worker_provider import (
    JoinerPlanner,
    LocalProcesses,
    WorkerHandle,
    WorkerProvider,
)
from kungfu_tf.run.worker_env.placement import Peer
from kungfu_tf.run.worker_env.worker_env import build_worker_env

if TYPE_CHECKING:  # imported where used: only --config-store needs etcd's stubs
    from kungfu_tf.run.control.etcd_client import EtcdClient
    from kungfu_tf.run.control.etcd_job_store import EtcdJobStore

# Bound on one config-service call (but a long poll).
CALL_TIMEOUT = 10.0
# Pause between attempts to reach the config service at start-up.
CONNECT_RETRY_SECONDS = 0.5
# Attempts at a ReportLost that raced with another change.
CAS_ATTEMPTS = 5
# How long a launcher with no worker running waits for a config service that
# does not answer before it ends (with workers running: --timeout), and how
# often it asks meanwhile.
IDLE_SERVICE_LOSS_SECONDS = 2.0
IDLE_PROBE_SECONDS = 0.5
# One long poll of the job state (the watcher polls again at once).
WATCH_POLL_SECONDS = 10.0
# How long the serving launcher keeps serving after the job is over, so that
# the other hosts' launchers (their watchers between two polls, or their idle
# probes) still read the final state rather than find the service gone.
JOB_END_LINGER_SECONDS = 1.0
# --config-store: how often a launcher looks at the live launchers and duties.
DUTY_CHECK_SECONDS = 0.5
# ... and how often while the store cannot serve.
STORE_DOWN_CHECK_SECONDS = 3.0
# The job's status when the cluster fell below --min-np.
BELOW_MIN_STATUS = 1

Joiner = config_pb2.Joiner


class _Interrupted(Exception):
    """A signal arrived before the workers started."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class _LocalWorker:
    """A worker this launcher started, and what it was started as."""

    process: WorkerHandle
    peer: str
    joiner: bool
    stopped_by_launcher: bool = False
    returncode: int | None = None
    # When a worker asked to stop gets SIGKILL if it is still running:
    # each its own grace, so that stopping one (a withdrawn joiner) never
    # kills the others.
    kill_at: float | None = None


class ElasticSupervisor:
    """Start, watch and replace this host's workers of an elastic job.

    Example::

        plan = build_elastic_plan(parse_args(argv), os.environ)
        status = ElasticSupervisor(plan, Console(), os.environ).run()

    ``provider`` says where workers run (default: this launcher's child
    processes; kungfu_tf/run/providers/worker_provider.py).
    """

    def __init__(
        self,
        plan: ElasticPlan,
        console: Console,
        base_env: Mapping[str, str],
        *,
        grace: float = GRACE_SECONDS,
        provider: WorkerProvider | None = None,
    ):
        """Prepare to run ``plan``; workers inherit ``base_env``."""
        self._plan = plan
        self._provider: WorkerProvider = provider if provider is not None else LocalProcesses()
        self._console = console
        self._base_env = base_env
        self._grace = grace
        self._server: ConfigServer | None = None
        self._client: ConfigClient | None = None
        self._watcher: JobWatcher | None = None
        self._probe_at = 0.0
        self._probe_failing_since: float | None = None
        self._scheduler: JoinerPlanner | None = None  # the serving launcher's
        self._workers: list[_LocalWorker] = []
        self._started: set[str] = set()
        self._next_label = 0
        self._pending_signals: list[int] = []
        self._status: int | None = None
        self._stopping = False
        # A member finished (here or, as the job state says, elsewhere).
        self._finishing = False
        self._said_waiting = False
        self._said_finished = False
        self._serve_until: float | None = None
        self._service_lost = False
        # What the job looks like: the newest state and the last printed version.
        self._state: config_pb2.JobState | None = None
        self._printed_version = 0
        self._printed_workers: list[str] = []
        self._last_change = ""
        self._ever_members: set[str] = set()
        self._exit_causes: dict[str, str] = {}
        self._rejected_seen: set[str] = set()
        self._joiner_end: dict[str, str] = {}
        self._display = StatusDisplay(console, console.status_every)
        # --config-store: the etcd client, the job's keys, the duties.
        self._etcd: EtcdClient | None = None
        self._store: EtcdJobStore | None = None
        self._stored_jobs: StoredJobStateMachine | None = None
        self._seen_launchers: set[str] = set()
        self._live_launchers: set[str] = set()
        self._registered_at = 0.0  # when this launcher registered (the others have --timeout from then)
        self._holds_duty = False
        self._duty_check_at = 0.0
        self._said_store_down = False

    # ----------------------------------------------------------------- run

    def run(self) -> int:
        """Run the job and return the launcher's exit status."""
        with caught_signals(self._on_signal):
            return self._run()

    def _run(self) -> int:
        try:
            try:
                initial, version = self._connect()
                logs = self._open_logs(initial)
            except LaunchError as e:
                self._console.message(f"error: {e}")
                return 2
            except _Interrupted as e:
                self._console.message(f"received {e}, stopping")
                return 128 + e.signum
            try:
                self._spawn_initial(initial, version, logs)
            except OSError as e:
                self._console.message(f"error: cannot start {self._plan.command[0]!r}: {e.strerror or e}")
                return 127
            return self._supervise()
        finally:
            self._teardown()

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self._pending_signals.append(signum)

    # ------------------------------------------------------------- connect

    def _connect(self) -> tuple[list[Peer], int]:
        """Serve or reach the config service; returns the members of version 1 and 1."""
        plan = self._plan
        if plan.config_store:
            return self._connect_store()
        if plan.serves:
            cluster = make_cluster(1, [p.address for p in plan.initial_peers])

            def make() -> ConfigServer:
                return ConfigServer(
                    plan.config_port,
                    secret=plan.secret,
                    job_id=plan.job_id,
                    host=plan.config_host,
                    cluster=cluster,
                    elastic=True,
                    min_size=plan.min_np,
                    max_size=plan.max_np,
                    replace_crashed=plan.replace_crashed,
                    admit_window=plan.admit_window,
                )

            try:
                # A --config-server port is the user's; one the kernel picks must not be a worker's.
                server = make().start() if plan.config_port else start_avoiding(make, self._initial_ports_here())
            except OSError as e:
                raise LaunchError(f"cannot serve the config service on {plan.config_address}: {e}") from None
            self._server = server
            self._plan = plan = plan.served_at(server.port)
            self._console.event(f"config service at {plan.config_address}")
            state = self._serve_joiners(plan)
            first = cluster
        else:
            state = self._reach_config_service()
            assert self._client is not None
            try:
                first = self._client.get_cluster_at(1)
            except grpc.RpcError as e:
                raise LaunchError(
                    f"the config service at {plan.config_address} has no cluster version 1: {rpc_error_text(e)}"
                ) from None
        return self._start_at(state, first), 1

    def _serve_joiners(self, plan: ElasticPlan) -> config_pb2.JobState:
        """A client of this launcher's own config service, and the planner of its joiners; the job's state."""
        self._client = ConfigClient(plan.config_address, secret=plan.secret, job_id=plan.job_id, timeout=CALL_TIMEOUT)
        state = self._client.get_job_state()
        hooks = SupervisorHooks(self._observe, self._fresh_state, self._remove_joiner, self._fail)
        self._scheduler = self._provider.joiner_planner(plan, self._client, self._console, hooks)
        return state

    def _start_at(self, state: config_pb2.JobState, first: config_pb2.Cluster) -> list[Peer]:
        """Takes the job as ``state`` finds it; returns the members of version 1 (``first``) to start here."""
        initial = [Peer(rank, w.host, w.port) for rank, w in enumerate(first.workers)]
        self._next_label = len(initial)
        if state.cluster.version != 1 and any(self._runs_here(p.host) for p in initial):
            # Too late: the others moved on without this host's members
            # (they are replaced, or the job goes on without them).
            self._console.message(
                f"the job is at cluster version {state.cluster.version} already: not starting the "
                f"members of version 1 placed on {self._plan.self_host}"
            )
            initial = [p for p in initial if not self._runs_here(p.host)]
        # Changes before this launcher connected are not its to print, but
        # their members are members (the end waits for other hosts' ones).
        self._printed_version = state.cluster.version
        self._printed_workers = cluster_peers(state.cluster)
        self._ever_members.update(self._printed_workers)
        self._console.event(
            f"cluster v{state.cluster.version}: {workers_text(len(state.cluster.workers))} "
            f"(min {state.min_size}, max {state.max_size or 'no limit'}, target {state.target_size})"
        )
        self._observe(state)
        # The long poll of the config service (which an etcd watch wakes, with --config-store).
        assert self._client is not None
        self._watcher = JobWatcher(self._client, poll_timeout=WATCH_POLL_SECONDS, unreachable_timeout=self._plan.timeout)
        return initial

    def _connect_store(self) -> tuple[list[Peer], int]:
        """--config-store: serve this host's workers from the job's state in etcd.

        The first launcher to reach the store commits the initial workers
        (every launcher placed them alike) as version 1; the others find
        them there. Each registers its host under a lease of its own.
        """
        from kungfu_tf.run.control.etcd_client import EtcdClient
        from kungfu_tf.run.control.etcd_job_store import EtcdJobStore

        plan = self._plan
        self._etcd = EtcdClient(plan.config_store, security=plan.config_store_security)
        store = EtcdJobStore(self._etcd, job_id=plan.job_id, secret=plan.secret, log=self._console.message)
        self._store = store
        initial_machine = JobStateMachine(
            make_cluster(1, [p.address for p in plan.initial_peers]),
            elastic=True,
            min_size=plan.min_np,
            max_size=plan.max_np,
            replace_crashed=plan.replace_crashed,
            admit_window=plan.admit_window,
        )
        try:
            record, _ = store.load()
            if record is None and store.ignored_records:
                # Another secret's job (or a forgery) holds this job id: never start a second job beside it.
                raise LaunchError(
                    f"the job {plan.job_id} in {store.describe()} has {store.ignored_records} state record(s), none "
                    "sealed with this KUNGFU_JOB_SECRET (see the lines above); export the same KUNGFU_JOB_SECRET "
                    "and KUNGFU_JOB_ID on every host (a new KUNGFU_JOB_ID for every run)"
                )
            jobs = StoredJobStateMachine(store, initial_machine)
            store.register_launcher(plan.self_host)
            self._registered_at = time.monotonic()
        except StoreUnavailableError as e:
            raise LaunchError(f"cannot use the config store {store.describe()}: {e}") from None
        self._stored_jobs = jobs
        if job_finished(jobs.job_state()):
            raise LaunchError(
                f"job {plan.job_id} already ran to its end in {store.describe()} (every member finished); "
                "export a new KUNGFU_JOB_ID for every run"
            )
        try:
            server = start_avoiding(
                lambda: ConfigServer(0, secret=plan.secret, job_id=plan.job_id, host=plan.self_host, jobs=jobs),
                self._initial_ports_here(),
            )
        except OSError as e:
            raise LaunchError(f"cannot serve this host's workers on {plan.self_host}: {e}") from None
        self._server = server
        self._plan = plan = plan.served_at(server.port)
        self._console.event(f"config service at {plan.config_address}, job state in {store.describe()}")
        state = self._serve_joiners(plan)
        return self._start_at(state, jobs.cluster_at(1)), 1

    def _keep_duties(self) -> None:
        """--config-store: the job-wide duties, done by whichever live launcher holds them.

        The holder of ``placer`` places joiners (on hosts whose launcher
        lives) and answers for hosts whose launcher is gone: their members
        are reported lost and their joiners withdrawn (their claims, tied to
        that launcher's lease, expired). A launcher that dies with the duty
        lets its key expire; the next launcher to look takes it over.
        """
        store, now = self._store, time.monotonic()
        if store is None or now < self._duty_check_at:
            return
        self._duty_check_at = now + DUTY_CHECK_SECONDS
        try:
            live = store.live_launchers()
            holds = store.hold_duty("placer")
        except StoreUnavailableError as e:
            # Each failed look costs up to an etcd call's deadline: look less often meanwhile.
            self._duty_check_at = time.monotonic() + STORE_DOWN_CHECK_SECONDS
            if not self._said_store_down:
                self._said_store_down = True
                self._console.message(
                    f"the config store cannot serve ({e}); membership changes wait until it has quorum again"
                )
            return
        if self._said_store_down:
            self._said_store_down = False
            self._console.event(f"the config store {store.describe()} answers again")
        if live != self._live_launchers:
            self._live_launchers = live
            self._console.event(f"live launchers: {', '.join(sorted(live)) or 'none'}")
        self._seen_launchers |= live
        if isinstance(self._scheduler, JoinerScheduler):
            self._scheduler.live_hosts = live
        if holds != self._holds_duty:
            self._holds_duty = holds
            if holds:
                self._console.event(f"{self._plan.self_host} places joiners and answers for lost launchers")
        if not holds:
            return
        absent = self._absent_launchers(live)
        state = self._fresh_state()
        if not absent or state is None:
            return
        done = set(cluster_peers(config_pb2.Cluster(workers=state.finished)))
        lost = [w for w in cluster_peers(state.cluster) if parse_peer_string(w).host in absent and w not in done]
        if lost:
            hosts = sorted({parse_peer_string(w).host for w in lost})
            reason = "; ".join(sorted({absent[h] for h in hosts}))
            self._console.message(f"{reason}: reporting {', '.join(lost)} lost")
            for peer in lost:
                self._exit_causes.setdefault(peer, reason)
            assert self._client is not None
            try:
                self._observe(self._client.report_lost(state.cluster.version, lost, reason))
            except grpc.RpcError as e:
                self._console.message(f"cannot report {', '.join(lost)} lost: {rpc_error_text(e)}")
        for peer in joiner_peers(state):
            if parse_peer_string(peer).host in absent:
                self._joiner_end.setdefault(peer, "its launcher is gone")
                self._remove_joiner(peer)

    def _absent_launchers(self, live: set[str]) -> dict[str, str]:
        """Hosts whose launcher is not there to run its members, and why: gone (registered, then its lease
        expired), or never registered in --timeout while members of version 1 wait for it (a launcher that
        failed to start would leave them unstarted and the job waiting for them for ever)."""
        absent = {h: f"the launcher of {h} is gone (its etcd lease expired)" for h in self._seen_launchers - live}
        waited = time.monotonic() - self._registered_at
        if waited >= self._plan.timeout:
            for host in {p.host for p in self._plan.initial_peers} - self._seen_launchers - live:
                absent[host] = f"the launcher of {host} did not register in --timeout {self._plan.timeout:g} s"
        return absent

    def _reach_config_service(self) -> config_pb2.JobState:
        """Connect to the serving launcher, retrying for --timeout seconds (it may start later)."""
        plan = self._plan
        deadline = time.monotonic() + plan.timeout
        while True:
            # A fresh channel per attempt: a channel that failed backs off for
            # ever longer before it tries again.
            client = ConfigClient(plan.config_address, secret=plan.secret, job_id=plan.job_id, timeout=CALL_TIMEOUT)
            try:
                state = client.get_job_state()
                self._client = client
                return state
            except grpc.RpcError as e:
                client.close()
                code, text = e.code(), rpc_error_text(e)
            if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise LaunchError(
                    f"the config service at {plan.config_address} refused this launcher ({text}); "
                    "export the same KUNGFU_JOB_SECRET and KUNGFU_JOB_ID on every host"
                )
            if code == grpc.StatusCode.FAILED_PRECONDITION:
                raise LaunchError(f"the config service at {plan.config_address} does not run an elastic job ({text})")
            if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or time.monotonic() >= deadline:
                raise LaunchError(
                    f"cannot reach the config service at {plan.config_address} (--config-server) "
                    f"within --timeout {plan.timeout} s: {text}"
                )
            if self._pending_signals:
                raise _Interrupted(self._pending_signals.pop(0))
            time.sleep(CONNECT_RETRY_SECONDS)

    # ------------------------------------------------------------ spawning

    def _open_log(self, name: str) -> BinaryIO | None:
        if self._plan.logdir is None:
            return None
        path = self._plan.logdir / name
        try:
            # Closed by the worker's output relay.
            return open(path, "wb")
        except OSError as e:
            raise LaunchError(f"cannot write log file {path} in --logdir {self._plan.logdir}: {e.strerror or e}") from None

    def _open_logs(self, initial: list[Peer]) -> list[BinaryIO | None]:
        """Every initial worker's log, opened before any starts (an unwritable --logdir is named as such)."""
        logs: list[BinaryIO | None] = []
        try:
            for peer in initial:
                if self._runs_here(peer.host):
                    logs.append(self._open_log(f"rank-{peer.rank}.log"))
        except LaunchError:
            for log in logs:
                if log is not None:
                    log.close()
            raise
        return logs

    def _spawn(self, peer: Peer, peers: list[Peer], version: int, log: BinaryIO | None, *, joiner: bool) -> _LocalWorker:
        plan = self._plan
        env = build_worker_env(
            self._base_env,
            peer,
            peers,
            topology=plan.topology,
            timeout=plan.timeout,
            secret=plan.secret,
            job_id=plan.job_id,
            cluster_version=version,
            config_server=plan.config_address,
            joiner=joiner,
        )
        process = self._provider.start_worker(peer, plan.command, env, self._console, echo=not plan.quiet, log=log)
        worker = _LocalWorker(process, peer.address, joiner)
        self._workers.append(worker)
        self._started.add(peer.address)
        return worker

    def _spawn_initial(self, initial: list[Peer], version: int, logs: list[BinaryIO | None]) -> None:
        local = [p for p in initial if self._runs_here(p.host)]
        try:
            for i, peer in enumerate(local):
                self._spawn(peer, initial, version, logs[i], joiner=False)
        except OSError:
            for log in logs[len(self._workers) + 1 :]:
                if log is not None:
                    log.close()
            raise
        # Reader threads start only once every initial worker is forked.
        for w in self._workers:
            w.process.start_output()

    def _start_local_joiners(self) -> None:
        """Start the STARTING joiners placed on this host that nobody started yet."""
        state = self._state
        if state is None or self._finishing or self._stopping:
            return
        for j in state.joiners:
            address = peer_string(j.peer)
            if j.state != Joiner.STARTING or not self._runs_here(j.peer.host) or address in self._started:
                continue
            label = self._next_label
            self._next_label += 1
            peer = Peer(label, j.peer.host, j.peer.port)
            try:
                log = self._open_log(f"joiner-{label}.log")
                worker = self._spawn(peer, [peer], 0, log, joiner=True)
            except (OSError, LaunchError) as e:
                self._started.add(address)
                self._console.message(f"cannot start joiner {address}: {getattr(e, 'strerror', None) or e}")
                self._joiner_end[address] = "could not be started"
                self._remove_joiner(address)
                continue
            worker.process.start_output()
            self._console.event(f"started joiner [{label}] {address}")

    # -------------------------------------------------------------- watch

    def _supervise(self) -> int:
        while True:
            self._handle_signals()
            self._take_news()
            self._reap()
            if not self._stopping:
                self._keep_duties()
                if self._scheduler is not None and (self._store is None or self._holds_duty):
                    self._scheduler.poll_hosts()
                    if self._state is not None and not self._finishing:
                        self._scheduler.place(self._state, [w.peer for w in self._running()])
                self._start_local_joiners()
                self._stop_orphaned_joiners()
                self._check_service()
            running = self._running()
            if not running and (self._stopping or self._service_lost):
                break
            if not running and self._job_over() and self._served_the_end():
                break
            if self._finishing and not self._stopping:
                # No joiner is admitted once a member finished: it would wait for ever.
                for w in running:
                    if w.joiner and w.peer not in self._ever_members and not w.stopped_by_launcher:
                        self._stop_worker(w, signal.SIGTERM)
                if not running:
                    self._say_waiting()
            self._kill_overdue(running)
            if running and self._display.due():
                self._show_status()
            time.sleep(POLL_INTERVAL)
        self._display.close()
        return self._status if self._status is not None else 0

    def _show_status(self) -> None:
        """The job's status line: the serving launcher reads the state locally, the others ask for it."""
        state = self._state
        if self._server is not None:
            state = self._server.job_state()
        elif self._client is not None:
            try:
                state = self._client.get_job_state()
            except grpc.RpcError:
                pass  # the last one watched (its progress may be older)
        if state is None:
            return
        progress = state.progress if state.HasField("progress") else None
        self._display.show(len(state.cluster.workers), state.cluster.version, progress)

    def _job_over(self) -> bool:
        """Every member of the current cluster finished (says so once)."""
        state = self._state
        if state is None or not job_finished(state):
            return False
        if not self._said_finished:
            self._said_finished = True
            self._console.event(
                f"all {len(state.cluster.workers)} members of cluster v{state.cluster.version} finished"
                if len(state.cluster.workers) > 1
                else f"the only member of cluster v{state.cluster.version} finished"
            )
        return True

    def _served_the_end(self) -> bool:
        """Whether the other hosts' launchers had their time to read the job's end.

        Only the serving launcher of a job with members on other hosts
        waits (JOB_END_LINGER_SECONDS); the others end at once.
        """
        if self._server is None or all(self._runs_here(parse_peer_string(m).host) for m in self._ever_members):
            return True
        now = time.monotonic()
        if self._serve_until is None:
            self._serve_until = now + JOB_END_LINGER_SECONDS
        return now >= self._serve_until

    def _say_waiting(self) -> None:
        """Nothing runs here any more, but members elsewhere do: say for whom the launcher waits."""
        state = self._state
        if self._said_waiting or state is None:
            return
        done = set(cluster_peers(config_pb2.Cluster(workers=state.finished)))
        others = [w for w in cluster_peers(state.cluster) if w not in done]
        if not others:
            return
        self._said_waiting = True
        shown = ", ".join(others[:8]) + (f", ... ({len(others) - 8} more)" if len(others) > 8 else "")
        self._console.event(
            f"no worker left on {self._plan.self_host}; waiting for {len(others)} "
            f"member{'s' if len(others) > 1 else ''} elsewhere to finish: {shown}"
        )

    def _initial_ports_here(self) -> set[int]:
        """The ports of the version-1 workers this launcher starts (its config service must not take one)."""
        return {p.port for p in self._plan.initial_peers if self._runs_here(p.host)}

    def _runs_here(self, host: str) -> bool:
        """Whether this launcher starts the workers placed on ``host``."""
        return self._provider.runs_here(host, self._plan.self_host)

    def _running(self) -> list[_LocalWorker]:
        return [w for w in self._workers if w.returncode is None]

    def _handle_signals(self) -> None:
        while self._pending_signals:
            sig = self._pending_signals.pop(0)
            name = signal.Signals(sig).name
            if self._status is None:
                self._status = 128 + sig
            if not self._stopping:
                self._console.message(f"received {name}, stopping workers")
                self._stop_all(sig)
            else:
                # A second Ctrl-C means "now", as users expect.
                self._console.message(f"received {name} again, killing workers")
                for w in self._running():
                    w.process.signal_group(signal.SIGKILL)

    def _stop_all(self, sig: int) -> None:
        self._stopping = True
        for w in self._running():
            self._stop_worker(w, sig)

    def _stop_worker(self, worker: _LocalWorker, sig: int) -> None:
        """Send ``sig`` to ``worker``; SIGKILL follows ``grace`` seconds later (this worker only)."""
        worker.stopped_by_launcher = True
        worker.process.signal_group(sig)
        if worker.kill_at is None:
            worker.kill_at = time.monotonic() + self._grace

    def _kill_overdue(self, running: list[_LocalWorker]) -> None:
        """SIGKILL the workers still running ``grace`` seconds after they were asked to stop."""
        now = time.monotonic()
        for w in running:
            if w.kill_at is not None and now >= w.kill_at:
                self._console.message(
                    f"worker [{w.process.peer.rank}] {w.peer} still running {self._grace:g}s after SIGTERM, "
                    "sending SIGKILL"
                )
                w.process.signal_group(signal.SIGKILL)
                w.kill_at = None

    def _fail(self, message: str) -> None:
        self._console.message(f"error: {message}")
        if self._status is None:
            self._status = BELOW_MIN_STATUS
        self._stop_all(signal.SIGTERM)

    def _take_news(self) -> None:
        if self._watcher is not None:
            state = self._watcher.latest()
            if state is not None:
                self._observe(state)

    def _fresh_state(self) -> config_pb2.JobState | None:
        """The state right now (a process exit is judged against it, not a stale one)."""
        assert self._client is not None
        try:
            state = self._client.get_job_state()
        except grpc.RpcError:
            return self._state
        self._observe(state)
        return self._state

    def _observe(self, state: config_pb2.JobState) -> None:
        """Take in a JobState newer than the last: print its changes, check --min-np."""
        if self._state is not None and state.state_version <= self._state.state_version:
            return
        self._state = state
        if state.finished:
            self._finishing = True
        for v in range(self._printed_version + 1, state.cluster.version + 1):
            cluster = state.cluster if v == state.cluster.version else self._cluster_at(v)
            if cluster is None:
                continue
            workers = cluster_peers(cluster)
            reason = self._server.commit_reason(v) if self._server is not None else None
            line = describe_change(v, self._printed_workers, workers, reason, self._exit_causes)
            self._last_change = line[line.index("(") + 1 : -1]
            self._console.event(line)
            self._printed_version, self._printed_workers = v, workers
            self._ever_members.update(workers)
        for j in state.joiners:
            address = peer_string(j.peer)
            if j.state == Joiner.REJECTED and address not in self._rejected_seen:
                self._rejected_seen.add(address)
                self._joiner_end[address] = "rejected"
                self._console.event(f"joiner {address} rejected: {j.reason}")
        if self._scheduler is not None:
            self._scheduler.note(state, self._ever_members, self._joiner_end)
        size = len(state.cluster.workers)
        # Once members finish, their peers may take their goodbyes for
        # losses: the exit codes decide then, not the cluster's size.
        if size < state.min_size and not self._stopping and not self._finishing:
            self._fail(self._below_minimum(size, state.min_size))

    def _below_minimum(self, size: int, min_size: int) -> str:
        if self._plan.replace_crashed or self._plan.min_np != self._plan.max_np:
            return f"cluster fell to {workers_text(size)}, below --min-np {min_size} ({self._last_change})"
        # A job that may not shrink (a --ray job without --elastic or --min-np,
        # or --min-np equal to -np): say what would have let it go on.
        return (
            f"cluster fell to {workers_text(size)}, below the job's minimum of {workers_text(min_size)} "
            f"({self._last_change}); every worker is needed unless --elastic or a lower --min-np is given"
        )

    def _cluster_at(self, version: int) -> config_pb2.Cluster | None:
        assert self._client is not None
        try:
            return self._client.get_cluster_at(version)
        except grpc.RpcError as e:
            self._console.message(f"cannot read cluster version {version}: {rpc_error_text(e)}")
            return None

    def _check_service(self) -> None:
        """A launcher that lost the config service can only let its workers end."""
        if self._service_lost or self._plan.serves or self._watcher is None:
            return
        error = self._watcher.error
        problem = str(error) if error is not None else None
        if problem is None and not self._running():
            problem = self._probe_idle()
        if problem is None:
            return
        self._service_lost = True
        if self._finishing and not self._running():
            # The serving launcher ends with the job: it most likely ended
            # before this launcher read the last member's finish.
            self._console.message(
                f"the config service stopped answering after members finished ({problem}); "
                "the job is over, most likely"
            )
            return
        self._console.message(
            f"lost the config service ({problem}); no more membership changes here, "
            f"waiting for the {len(self._running())} running worker(s) to end"
        )
        for w in self._running():
            if w.joiner and w.peer not in self._ever_members:
                self._stop_worker(w, signal.SIGTERM)

    def _probe_idle(self) -> str | None:
        """With nothing running here there is nothing to protect: a config
        service that stops answering (the serving launcher ended with the
        job, most likely) ends this launcher within IDLE_SERVICE_LOSS_SECONDS,
        not the watcher's --timeout."""
        now = time.monotonic()
        if now < self._probe_at:
            return None
        self._probe_at = now + IDLE_PROBE_SECONDS
        assert self._client is not None
        try:
            self._observe(self._client.get_job_state())
        except grpc.RpcError as e:
            self._probe_failing_since = self._probe_failing_since or now
            if now - self._probe_failing_since >= IDLE_SERVICE_LOSS_SECONDS:
                return (
                    f"{self._plan.config_address} did not answer for "
                    f"{IDLE_SERVICE_LOSS_SECONDS:g} s: {rpc_error_text(e)}"
                )
            return None
        self._probe_failing_since = None
        return None

    # -------------------------------------------------------------- exits

    def _reap(self) -> None:
        for w in self._running():
            rc = w.process.poll()
            if rc is None:
                continue
            w.returncode = rc
            self._take_exit(w, rc)
            # Only once its exit is judged (a member that shrank away has
            # left the cluster by now): what held the worker can go.
            self._provider.release(w.process)

    def _take_exit(self, w: _LocalWorker, rc: int) -> None:
        if self._stopping or w.stopped_by_launcher:
            return
        if rc != 0:
            self._exit_causes[w.peer] = self._cause(w, rc)
        if self._service_lost:
            if rc != 0 and self._status is None:
                self._console.message(f"worker {w.peer} {describe_exit(rc)}")
                self._status = exit_status(rc)
            return
        self._judge_exit(w, rc)

    def _judge_exit(self, w: _LocalWorker, rc: int) -> None:
        state = self._fresh_state()
        members = cluster_peers(state.cluster) if state is not None else []
        joiners = joiner_peers(state) if state is not None else []
        label = w.process.peer.rank
        if w.peer in members:
            if rc == 0:
                self._report_finished(w.peer)
                return
            self._console.message(f"worker [{label}] {w.peer} {self._exit_text(w, rc)}")
            if self._finishing and self._status is None:
                # The job ends well only if every member exits 0.
                self._status = exit_status(rc)
            self._report_lost(w.peer, self._cause(w, rc))
        elif w.peer in joiners or (w.joiner and w.peer not in self._ever_members):
            self._joiner_end.setdefault(w.peer, "exited before it was admitted" if rc == 0 else exit_cause(rc))
            if rc != 0 and self._joiner_end[w.peer] != "rejected":
                self._console.message(f"joiner [{label}] {w.peer} {self._exit_text(w, rc)}")
            self._remove_joiner(w.peer)
        elif rc != 0:
            # Already removed (its peers reported it first); nothing to do.
            self._console.message(f"worker [{label}] {w.peer} (no longer a member) {self._exit_text(w, rc)}")

    @staticmethod
    def _cause(w: _LocalWorker, rc: int) -> str:
        """Why a worker died: what its provider knows (a Ray actor's death), else its exit."""
        return getattr(w.process, "exit_reason", None) or exit_cause(rc)

    @staticmethod
    def _exit_text(w: _LocalWorker, rc: int) -> str:
        """``failed with exit code N``, ``killed by signal S``, or what its provider knows."""
        reason = getattr(w.process, "exit_reason", None)
        return reason if reason else describe_exit(rc)

    def _report_lost(self, peer: str, cause: str) -> None:
        assert self._client is not None
        for _ in range(CAS_ATTEMPTS):
            state = self._state
            if state is None or peer not in cluster_peers(state.cluster):
                return
            try:
                self._observe(self._client.report_lost(state.cluster.version, [peer], cause))
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    self._console.message(f"cannot report {peer} lost: {rpc_error_text(e)}")
                    return
            # Another change may have been committed in between: look again.
            self._fresh_state()

    def _report_finished(self, peer: str) -> None:
        """A member exited 0: tell every launcher (the job ends when all members did)."""
        assert self._client is not None
        try:
            self._observe(self._client.report_finished(peer))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return  # left out by the version just committed: it detached
            self._console.message(f"cannot report {peer} finished: {rpc_error_text(e)}")
        self._finishing = True

    def _remove_joiner(self, peer: str) -> None:
        assert self._client is not None
        try:
            self._observe(self._client.remove_joiner(peer))
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                self._console.message(f"cannot remove joiner {peer}: {rpc_error_text(e)}")

    def _stop_orphaned_joiners(self) -> None:
        """Stop local joiners the serving launcher withdrew (they would wait for ever)."""
        state = self._state
        if state is None:
            return
        pending = set(joiner_peers(state)) | set(cluster_peers(state.cluster))
        for w in self._running():
            if w.joiner and not w.stopped_by_launcher and w.peer not in pending and w.peer not in self._ever_members:
                self._console.event(f"stopping joiner {w.peer}: it was withdrawn")
                self._stop_worker(w, signal.SIGTERM)

    # ------------------------------------------------------------ teardown

    def _teardown(self) -> None:
        self._display.close()
        for w in self._workers:
            if w.process.poll() is None:
                w.process.signal_group(signal.SIGKILL)
                w.process.wait()
        if self._status not in (None, 0):
            for w in self._workers:
                w.process.kill_group()
        for w in self._workers:
            w.process.finish_output(OUTPUT_DRAIN_SECONDS)
        if self._watcher is not None:
            self._watcher.stop()
        if self._scheduler is not None:
            self._scheduler.stop()
        self._provider.close()
        if self._client is not None:
            self._client.close()
        if self._server is not None:
            self._server.stop(grace=1.0)
        if self._stored_jobs is not None:
            self._stored_jobs.close()
        if self._store is not None:
            self._store.close()  # revokes this launcher's lease: its claims end now
        if self._etcd is not None:
            self._etcd.close()
