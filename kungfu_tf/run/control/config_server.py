"""In-memory gRPC ConfigService (proto/config.proto): the job's membership.

The launcher runs one ConfigServer per job; launchers and workers use
ConfigClient to read the current Cluster and, on an elastic resize, to replace
it. PutCluster is a compare-and-swap on Cluster.version (the new version must
be the current one + 1), so two launchers cannot both apply a resize.

Elastic jobs (``ConfigServer(elastic=True)``) also keep a JobState: target
size, min/max, the model signature, joiners, finished members and a ``state_version`` that
launchers and workers long-poll (WaitJobState). The rules live in
kungfu_tf/run/control/job_state.py; this module is the gRPC glue: it maps
:class:`~kungfu_tf.run.control.job_state.JobStateError` to status codes and gives
each long poll its own thread without starving the other calls.

Every call is authenticated both ways by challenge-response keyed with the
job secret (kungfu_tf/run/control/config_auth.py): the secret itself never crosses
the wire, a wrong or missing proof gets PERMISSION_DENIED, and ConfigClient
refuses an answer from a server that cannot prove it holds the secret. The
channel is not encrypted: cluster contents are visible, not forgeable.
``job_id`` (the same on server and clients) binds the proofs to one job, so
two jobs that share a secret cannot serve each other's clients.

Example::

    server = ConfigServer(secret=secret, job_id=job_id, host="0.0.0.0", elastic=True, max_size=8)
    server.start()
    with ConfigClient(f"{host}:{server.port}", secret=secret, job_id=job_id) as client:
        current = client.get_cluster()
        client.put_cluster(make_cluster(current.version + 1, ["10.0.0.1:10000", "10.0.0.2:10000"]))
        state = client.request_size(3)  # launchers start a joiner
        state = client.wait_job_state(state.state_version, timeout=30.0)
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Collection, Iterable, Sequence
from concurrent import futures
from typing import NoReturn, Self

import grpc

from kungfu_tf.proto import config_pb2, config_pb2_grpc
from kungfu_tf.run.control.config_auth import (
    MAC_METADATA_KEY,
    NONCE_BYTES,
    NONCE_METADATA_KEY,
    SERVER_MAC_METADATA_KEY,
    NonceBook,
    macs_equal,
    request_mac,
    response_mac,
)
from kungfu_tf.run.control.job_state import (
    MAX_WAIT_SECONDS,
    JobStateError,
    JobStateMachine,
    cluster_problem,
)
from kungfu_tf.run.control.peer_string import (
    cluster_peers,
    parse_peer_string,
    peer_string,
)
from kungfu_tf.run.control.stored_job_state import StoredJobStateMachine

SERVICE = "/kungfu.ConfigService/"
CHALLENGE_METHOD = SERVICE + "Challenge"

__all__ = [
    "ConfigClient",
    "ConfigServer",
    "PendingCall",
    "ServerNotAuthenticatedError",
    "cluster_peers",
    "make_cluster",
    "parse_peer_string",
    "peer_string",
]

# Threads kept for the short calls beside the long polls (ConfigServer(max_workers=...)).
DEFAULT_SHORT_CALL_THREADS = 4
# Long polls served at once: one per worker and launcher of a large job.
DEFAULT_MAX_LONG_POLLS = 256
_UINT32_MAX = 2**32 - 1
_UINT64_MAX = 2**64 - 1


class ServerNotAuthenticatedError(grpc.RpcError):
    """The server's answer did not carry a valid proof that it holds the job secret."""

    def __init__(self, address: str, method: str):
        super().__init__(f"config server at {address} did not prove it holds the job secret ({method})")
        self._details = str(self)

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAUTHENTICATED

    def details(self) -> str:
        return self._details


def _secret_bytes(secret: str | bytes) -> bytes:
    """Validates a job secret; returns it as bytes (for hmac.compare_digest)."""
    if isinstance(secret, bytes):
        try:
            secret = secret.decode("ascii")
        except UnicodeDecodeError:
            raise ValueError("job secret must be printable ASCII") from None
    if not isinstance(secret, str):
        raise TypeError(f"job secret must be str or bytes, not {type(secret).__name__}")
    if not secret:
        raise ValueError("job secret must not be empty")
    # Printable ASCII, as exported in an environment variable.
    if not all(" " <= c <= "~" for c in secret):
        raise ValueError(
            "job secret must be printable ASCII (use e.g. secrets.token_hex())"
        )
    return secret.encode("ascii")


def make_cluster(
    version: int, workers: Iterable[str | tuple[str, int] | config_pb2.PeerID]
) -> config_pb2.Cluster:
    """Builds a Cluster from "host:port" strings, (host, port) pairs or PeerIDs, in rank order.

    Example:
        >>> make_cluster(2, ["10.0.0.1:10000", ("10.0.0.2", 10000)]).workers[1].host
        '10.0.0.2'
    """
    cluster = config_pb2.Cluster(version=version)
    for w in workers:
        if isinstance(w, config_pb2.PeerID):
            cluster.workers.add().CopyFrom(w)
        elif isinstance(w, str):
            cluster.workers.add().CopyFrom(parse_peer_string(w))
        else:
            host, port = w
            cluster.workers.add(host=host, port=port)
    return cluster


def _rpc(method):
    """Answers a JobStateError with its status code and "<Method>: <message>"."""

    @functools.wraps(method)
    def handler(self, request, context):
        try:
            return method(self, request, context)
        except JobStateError as e:
            context.abort(getattr(grpc.StatusCode, e.code), f"{method.__name__}: {e}")

    return handler


class _Servicer(config_pb2_grpc.ConfigServiceServicer):
    def __init__(self, jobs: JobStateMachine | StoredJobStateMachine, nonces: NonceBook, max_long_polls: int):
        self._jobs = jobs
        self._nonces = nonces
        self._max_long_polls = max_long_polls
        # Non-blocking: a long poll over the limit is refused, never queued
        # (a queued one would hold a thread the short calls need).
        self._long_poll_slots = threading.BoundedSemaphore(max_long_polls)
        self._waiting_lock = threading.Lock()
        self.long_polls_waiting = 0  # WaitJobState calls holding a slot now

    def _count_waiting(self, delta: int) -> None:
        with self._waiting_lock:
            self.long_polls_waiting += delta

    def Challenge(self, request, context):
        return config_pb2.ChallengeResponse(nonce=self._nonces.issue())

    @_rpc
    def GetCluster(self, request, context):
        return self._jobs.cluster()

    @_rpc
    def PutCluster(self, request, context):
        if not request.HasField("cluster"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "PutCluster: missing cluster")
        return config_pb2.PutClusterResponse(cluster=self._jobs.put_cluster(request.cluster))

    @_rpc
    def GetJobState(self, request, context):
        return self._jobs.job_state()

    @_rpc
    def WaitJobState(self, request, context):
        if not self._long_poll_slots.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"WaitJobState: {self._max_long_polls} long polls are already waiting "
                "(ConfigServer(max_long_polls=...)); poll again later",
            )
        returned = False
        self._count_waiting(1)

        def on_rpc_done():
            # A cancelled or expired call: wake the waiters so this one sees it.
            if not returned:
                self._jobs.wake()

        try:
            context.add_callback(on_rpc_done)
            timeout = min(request.timeout_ms / 1000.0, MAX_WAIT_SECONDS)
            return self._jobs.wait(request.after_state_version, timeout, cancelled=lambda: not context.is_active())
        finally:
            returned = True
            self._count_waiting(-1)
            self._long_poll_slots.release()

    @_rpc
    def GetClusterAt(self, request, context):
        return self._jobs.cluster_at(request.version)

    @_rpc
    def RequestSize(self, request, context):
        return self._jobs.request_size(request.size)

    @_rpc
    def ReportLost(self, request, context):
        return self._jobs.report_lost(request.version, list(request.peers), request.reason)

    @_rpc
    def ReportFinished(self, request, context):
        return self._jobs.report_finished(request.peer)

    @_rpc
    def AddJoiner(self, request, context):
        return self._jobs.add_joiner(request.peer)

    @_rpc
    def JoinerReady(self, request, context):
        return self._jobs.joiner_ready(request.peer, request.signature)

    @_rpc
    def SetSignature(self, request, context):
        return self._jobs.set_signature(request.signature, grow=request.grow)

    @_rpc
    def RemoveJoiner(self, request, context):
        return self._jobs.remove_joiner(request.peer)

    @_rpc
    def ReportProgress(self, request, context):
        self._jobs.report_progress(request.step, request.version)
        return config_pb2.ReportProgressResponse()


class _ChallengeResponseAuth(grpc.ServerInterceptor):
    """Lets a call through only with a valid proof for a nonce this server issued,
    and adds the server's own proof to the answer (see config_auth)."""

    def __init__(self, key: bytes, job_id: str, nonces: NonceBook):
        self._key = key
        self._job_id = job_id
        self._nonces = nonces

    @staticmethod
    def _single(metadata, key: str) -> str | bytes | None:
        values = [v for k, v in (metadata or ()) if k == key]
        return values[0] if len(values) == 1 else None

    def _nonce(self, metadata) -> bytes | None:
        text = self._single(metadata, NONCE_METADATA_KEY)
        try:
            nonce = bytes.fromhex(text if isinstance(text, str) else "")
        except ValueError:
            return None
        # Redeemed before the MAC is checked: one guess per nonce.
        return nonce if len(nonce) == NONCE_BYTES and self._nonces.redeem(nonce) else None

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method == CHALLENGE_METHOD:
            return handler  # unknown methods: gRPC answers UNIMPLEMENTED
        metadata = handler_call_details.invocation_metadata

        def deny(context, why: str) -> NoReturn:
            # grpc's abort raises: the call ends here.
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method}: {why} (challenge-response with the job secret failed)",
            )
            raise AssertionError("grpc's ServicerContext.abort returned")

        if handler.request_streaming or handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(lambda request, context: deny(context, "streaming call"))

        def guarded(raw_request: bytes, context):
            nonce = self._nonce(metadata)
            if nonce is None:
                deny(context, "missing, unknown, expired or reused nonce")
            expected = request_mac(self._key, nonce, method, self._job_id, raw_request)
            if not macs_equal(expected, self._single(metadata, MAC_METADATA_KEY)):
                deny(context, "missing or wrong proof")
            response = handler.unary_unary(handler.request_deserializer(raw_request), context)
            raw_response = handler.response_serializer(response)
            proof = response_mac(self._key, nonce, method, self._job_id, raw_response)
            context.set_trailing_metadata(((SERVER_MAC_METADATA_KEY, proof),))
            return raw_response

        # No (de)serializers: the proofs cover the exact bytes on the wire.
        return grpc.unary_unary_rpc_method_handler(guarded)


class PortAvoidedError(OSError):
    """``ConfigServer.start(avoid=...)``: the kernel picked one of the ports to avoid."""


class ConfigServer:
    """Thread-safe in-memory ConfigService.

    Args:
      port: TCP port to listen on; 0 picks a free port (read it from .port
        after start()).
      secret: the job secret clients must prove they hold (printable ASCII);
        it never leaves this process.
      job_id: identity of the job; clients must name the same.
      host: address to bind. The default accepts local clients only; use
        "0.0.0.0" (or "[::]") for workers on other hosts.
      cluster: initial Cluster; default version 0 with no workers.
      max_workers: gRPC handler threads for the short calls (every call but
        WaitJobState).
      elastic: serve the elastic RPCs (RequestSize, ReportLost, joiners,
        signatures); without it they fail with FAILED_PRECONDITION.
      min_size, max_size: the job's bounds on the cluster size
        (kungfu-run --min-np/--max-np; max_size 0 = no limit).
      replace_crashed: a ReportLost keeps target_size, so launchers start
        replacements for crashed workers.
      max_long_polls: WaitJobState calls served at once (each holds a thread
        of its own, beside the max_workers ones); more get RESOURCE_EXHAUSTED.
      admit_window: seconds READY joiners wait for the other joiners of
        their growth, to be admitted in one version (kungfu-run
        --admit-window; 0 admits each when it is READY). A thread of the
        server ends each window on time.
      jobs: serve this job state, shared through a store with other
        launchers' config services (stored_job_state.py: ``--config-store``),
        instead of one of its own; ``cluster`` and the sizes are then the
        store's.

    Example:
        >>> with ConfigServer(secret="s3cret", elastic=True, cluster=make_cluster(1, ["h:1"])) as srv:
        ...     srv.job_state().target_size
        1
    """

    def __init__(
        self,
        port: int = 0,
        *,
        secret: str | bytes,
        job_id: str = "",
        host: str = "127.0.0.1",
        cluster: config_pb2.Cluster | None = None,
        max_workers: int = DEFAULT_SHORT_CALL_THREADS,
        elastic: bool = False,
        min_size: int = 1,
        max_size: int = 0,
        replace_crashed: bool = False,
        max_long_polls: int = DEFAULT_MAX_LONG_POLLS,
        admit_window: float = 0.0,
        jobs: StoredJobStateMachine | None = None,
    ):
        self._secret = _secret_bytes(secret)
        self._job_id = job_id
        self._host = host
        self.port = port
        for name, value in (("max_workers", max_workers), ("max_long_polls", max_long_polls)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self._max_workers = max_workers
        self._max_long_polls = max_long_polls
        initial = cluster if cluster is not None else config_pb2.Cluster()
        problem = cluster_problem(initial)
        if problem is not None:
            raise ValueError(f"initial cluster: {problem}")
        self._jobs: JobStateMachine | StoredJobStateMachine = (
            jobs
            if jobs is not None
            else JobStateMachine(
                initial,
                elastic=elastic,
                min_size=min_size,
                max_size=max_size,
                replace_crashed=replace_crashed,
                admit_window=admit_window,
            )
        )
        self._admission_timer: threading.Thread | None = None
        self._nonces = NonceBook()
        self._servicer = _Servicer(self._jobs, self._nonces, max_long_polls)
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        """host:port clients can dial (valid after start())."""
        host = self._host
        if host in ("0.0.0.0", "[::]", "::", ""):
            host = "127.0.0.1"
        elif ":" in host and not host.startswith("["):
            host = f"[{host}]"  # IPv6 literal
        return f"{host}:{self.port}"

    def start(self, avoid: Collection[int] = ()) -> Self:
        """Binds and serves (and runs the admission timer).

        ``avoid``: ports this server must not serve on (the launcher's
        workers' ports, when the kernel picks one for port 0): the server
        stops at once, releasing the port, and raises
        :class:`PortAvoidedError` before its admission timer starts; a
        fresh ConfigServer may try again.
        """
        if self._server is not None:
            raise RuntimeError("ConfigServer already started")
        server = grpc.server(
            # Threads start on demand: idle long-poll slots cost nothing.
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers + self._max_long_polls, thread_name_prefix="kungfu-config"
            ),
            interceptors=[_ChallengeResponseAuth(self._secret, self._job_id, self._nonces)],
        )
        config_pb2_grpc.add_ConfigServiceServicer_to_server(self._servicer, server)
        bind = f"{self._host}:{self.port}"
        try:
            port = server.add_insecure_port(bind)
        except RuntimeError as e:
            raise OSError(f"ConfigServer: cannot listen on {bind}: {e}") from e
        if port == 0:
            raise OSError(f"ConfigServer: cannot listen on {bind}")
        server.start()
        if port in avoid:
            # Before the admission timer, which a shared job state (--config-store) could not restart; a
            # started gRPC server's stop lets the port go (a bound, unstarted one kept it).
            server.stop(None).wait()
            raise PortAvoidedError(f"ConfigServer: the kernel gave port {port}, one to avoid")
        self.port = port
        self._server = server
        if self._jobs.admit_window > 0:
            self._admission_timer = threading.Thread(
                target=self._jobs.run_admission_timer, name="kungfu-config-admission", daemon=True
            )
            self._admission_timer.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stops serving; in-flight calls get `grace` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            stopped = server.stop(grace)
            self._jobs.release_waiters()  # long polls answer now instead of at their timeout
            stopped.wait()
        timer, self._admission_timer = self._admission_timer, None
        if timer is not None:
            self._jobs.stop_admission_timer()
            timer.join()

    @property
    def long_polls_waiting(self) -> int:
        """WaitJobState calls waiting in the server now (each holds one of ``max_long_polls`` slots)."""
        return self._servicer.long_polls_waiting

    def get_cluster(self) -> config_pb2.Cluster:
        """The current Cluster, read locally (no RPC, no secret needed)."""
        return self._jobs.cluster()

    def job_state(self) -> config_pb2.JobState:
        """The current JobState, read locally."""
        return self._jobs.job_state()

    def wait_job_state(self, after_state_version: int, timeout: float) -> config_pb2.JobState:
        """Local long poll: the JobState once state_version > after_state_version, or at the timeout."""
        return self._jobs.wait(after_state_version, timeout)

    def commit_reason(self, version: int) -> str:
        """Why cluster ``version`` was committed, e.g. "lost 127.0.0.1:10002: killed by SIGKILL"."""
        return self._jobs.commit_reason(version)

    def __enter__(self) -> Self:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _check_uint(name: str, value: int, limit: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ValueError(f"{name} must be an integer in 0..{limit}, got {value!r}")
    return value


def _peer_argument(name: str, peer: str) -> config_pb2.PeerID:
    try:
        return parse_peer_string(peer)
    except (ValueError, TypeError) as e:
        raise type(e)(f"{name}: {e}") from None


class PendingCall:
    """A ConfigClient call in flight (see ConfigClient.start_wait_job_state).

    ``result()`` waits for the answer, checks the server's proof and returns
    the response message (or raises grpc.RpcError); ``cancel()`` abandons the
    call, after which ``result()`` raises grpc.FutureCancelledError.
    """

    def __init__(self, future, key: bytes, nonce: bytes, method: str, job_id: str, address: str, response_type):
        self._future = future
        self._key = key
        self._nonce = nonce
        self._method = method
        self._job_id = job_id
        self._address = address
        self._response_type = response_type

    def result(self, timeout: float | None = None):
        """The response message; raises grpc.RpcError, ServerNotAuthenticatedError or
        grpc.FutureCancelledError (after cancel())."""
        raw_response = self._future.result(timeout=timeout)
        expected = response_mac(self._key, self._nonce, self._method, self._job_id, raw_response)
        proofs = [v for k, v in (self._future.trailing_metadata() or ()) if k == SERVER_MAC_METADATA_KEY]
        if len(proofs) != 1 or not macs_equal(expected, proofs[0]):
            raise ServerNotAuthenticatedError(self._address, self._method)
        return self._response_type.FromString(raw_response)

    def cancel(self) -> bool:
        """Abandons the call (the server's long poll ends at once)."""
        return self._future.cancel()

    def done(self) -> bool:
        return self._future.done()


class ConfigClient:
    """Client for a ConfigServer at `address` ("host:port").

    Each call first fetches a challenge, then sends the call with its proof
    (see config_auth); the job secret is never sent. Peers are "host:port"
    strings (IPv6 as "[addr]:port").

    Failed calls raise grpc.RpcError; check .code():
      PERMISSION_DENIED    wrong job secret or job id
      UNAUTHENTICATED      the server could not prove it holds the job secret
                           (ServerNotAuthenticatedError)
      FAILED_PRECONDITION  put_cluster version conflict (re-read and retry);
                           an elastic call to a server that is not elastic;
                           a signature that differs from the job's;
                           report_finished of a peer that is not a member
      INVALID_ARGUMENT     malformed cluster or peer; report_lost naming a
                           non-member or a version never committed
      OUT_OF_RANGE         a size outside the job's [min_size, max_size]
      NOT_FOUND            get_cluster_at of a version never committed;
                           remove_joiner of a peer that is not a joiner
      ALREADY_EXISTS       add_joiner of a member or of a READY/REJECTED joiner
      RESOURCE_EXHAUSTED   too many long polls waiting at once
      UNAVAILABLE          server unreachable

    Example::

        with ConfigClient("127.0.0.1:38080", secret=secret, job_id=job_id) as client:
            state = client.get_job_state()
            while not done:
                state = client.wait_job_state(state.state_version, timeout=30.0)
    """

    def __init__(self, address: str, *, secret: str | bytes, job_id: str = "", timeout: float = 10.0):
        self._address = address
        self._key = _secret_bytes(secret)
        self._job_id = job_id
        self._timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._challenge = self._channel.unary_unary(
            CHALLENGE_METHOD,
            request_serializer=config_pb2.ChallengeRequest.SerializeToString,
            response_deserializer=config_pb2.ChallengeResponse.FromString,
        )

    @property
    def address(self) -> str:
        return self._address

    def _start(self, name: str, request, response_type, *, timeout: float | None = None) -> PendingCall:
        method = SERVICE + name
        nonce = self._challenge(config_pb2.ChallengeRequest(), timeout=self._timeout).nonce
        raw_request = request.SerializeToString()
        proof = request_mac(self._key, nonce, method, self._job_id, raw_request)
        # Bytes in and out, so that both proofs cover exactly what travelled.
        future = self._channel.unary_unary(method).future(
            raw_request,
            metadata=((NONCE_METADATA_KEY, nonce.hex()), (MAC_METADATA_KEY, proof)),
            timeout=self._timeout if timeout is None else timeout,
        )
        return PendingCall(future, self._key, nonce, method, self._job_id, self._address, response_type)

    def _call(self, name: str, request, response_type, *, timeout: float | None = None):
        return self._start(name, request, response_type, timeout=timeout).result()

    def get_cluster(self) -> config_pb2.Cluster:
        return self._call("GetCluster", config_pb2.GetClusterRequest(), config_pb2.Cluster)

    def put_cluster(self, cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        """Stores `cluster` if cluster.version == current version + 1.

        Returns the stored cluster; raises grpc.RpcError with
        FAILED_PRECONDITION if another writer got there first (and, in an
        elastic job, OUT_OF_RANGE for a size outside [min_size, max_size]).
        """
        request = config_pb2.PutClusterRequest(cluster=cluster)
        return self._call("PutCluster", request, config_pb2.PutClusterResponse).cluster

    def get_job_state(self) -> config_pb2.JobState:
        """The whole JobState (cluster, target size, joiners, state_version)."""
        return self._call("GetJobState", config_pb2.GetJobStateRequest(), config_pb2.JobState)

    def wait_job_state(self, after_state_version: int, timeout: float) -> config_pb2.JobState:
        """Long poll: the JobState once its state_version > ``after_state_version``.

        Answers with the current (unchanged) state after ``timeout`` seconds,
        which is capped at 60 s: loop on it to watch the job (or use
        kungfu_tf.run.control.job_watcher.JobWatcher).
        """
        return self.start_wait_job_state(after_state_version, timeout).result()

    def start_wait_job_state(self, after_state_version: int, timeout: float) -> PendingCall:
        """Starts :meth:`wait_job_state` without blocking: ``.result()`` waits, ``.cancel()`` gives up."""
        _check_uint("after_state_version", after_state_version, _UINT64_MAX)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        wait = min(float(timeout), MAX_WAIT_SECONDS)
        request = config_pb2.WaitJobStateRequest(
            after_state_version=after_state_version, timeout_ms=int(wait * 1000)
        )
        # The call's deadline leaves the server its whole wait plus the usual margin.
        return self._start("WaitJobState", request, config_pb2.JobState, timeout=wait + self._timeout)

    def get_cluster_at(self, version: int) -> config_pb2.Cluster:
        """The Cluster committed as ``version`` (NOT_FOUND if it never was)."""
        request = config_pb2.GetClusterAtRequest(version=_check_uint("version", version, _UINT64_MAX))
        return self._call("GetClusterAt", request, config_pb2.Cluster)

    def request_size(self, n: int) -> config_pb2.JobState:
        """Sets the job's target_size to ``n`` (OUT_OF_RANGE outside [min_size, max_size])."""
        request = config_pb2.RequestSizeRequest(size=_check_uint("n", n, _UINT32_MAX))
        return self._call("RequestSize", request, config_pb2.JobState)

    def report_lost(self, version: int, peers: Sequence[str], reason: str = "") -> config_pb2.JobState:
        """Members ``peers`` of cluster ``version`` crashed: the first report commits version + 1."""
        if isinstance(peers, str):
            raise TypeError(f"peers must be a list of 'host:port' strings, not the string {peers!r}")
        request = config_pb2.ReportLostRequest(
            version=_check_uint("version", version, _UINT64_MAX),
            peers=[_peer_argument(f"peers[{i}]", p) for i, p in enumerate(peers)],
            reason=reason,
        )
        return self._call("ReportLost", request, config_pb2.JobState)

    def report_finished(self, peer: str) -> config_pb2.JobState:
        """The member at ``peer`` exited 0: it is listed in JobState.finished.

        The job is over when every member has finished
        (:func:`kungfu_tf.run.control.job_state.job_finished`); FAILED_PRECONDITION if
        ``peer`` is not a member of the current cluster (it detached).
        """
        request = config_pb2.ReportFinishedRequest(peer=_peer_argument("peer", peer))
        return self._call("ReportFinished", request, config_pb2.JobState)

    def add_joiner(self, peer: str) -> config_pb2.JobState:
        """Announces a joiner process started at ``peer`` (STARTING)."""
        request = config_pb2.AddJoinerRequest(peer=_peer_argument("peer", peer))
        return self._call("AddJoiner", request, config_pb2.JobState)

    def joiner_ready(self, peer: str, signature: str) -> config_pb2.JobState:
        """The joiner at ``peer`` is warm, with model ``signature``; it may be admitted at once."""
        request = config_pb2.JoinerReadyRequest(peer=_peer_argument("peer", peer), signature=signature)
        return self._call("JoinerReady", request, config_pb2.JobState)

    def set_signature(self, signature: str, grow: bool = False) -> config_pb2.JobState:
        """Reports the members' model signature (the first call sets the job's; ``grow``: it gained variables)."""
        request = config_pb2.SetSignatureRequest(signature=signature, grow=grow)
        return self._call("SetSignature", request, config_pb2.JobState)

    def remove_joiner(self, peer: str) -> config_pb2.JobState:
        """Forgets the joiner at ``peer`` (its process exited or was stopped)."""
        request = config_pb2.AddJoinerRequest(peer=_peer_argument("peer", peer))
        return self._call("RemoveJoiner", request, config_pb2.JobState)

    def report_progress(self, step: int, version: int) -> None:
        """Rank 0 trained to ``step`` at cluster ``version`` (shown as steps/s by kungfu-run's job status)."""
        request = config_pb2.ReportProgressRequest(step=step, version=version)
        self._call("ReportProgress", request, config_pb2.ReportProgressResponse)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
