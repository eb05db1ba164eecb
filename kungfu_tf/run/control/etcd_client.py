"""A small etcd v3 client: the calls ``--config-store etcd://...`` needs, over our own stubs.

Why stubs and not a client library: the ``etcd3`` package on PyPI pins a
protobuf 3 runtime (its generated code refuses protobuf 7, which our
config.proto stubs need) and is unmaintained; the asyncio clients would
bring an event loop into a launcher built on threads. etcd's v3 API is
plain gRPC, so proto/etcd_rpc.proto lists the part of it we use and
setup.py generates its stubs with the grpcio-tools we already build with:
no new dependency.

Every call goes to one member; when that member does not answer
(UNAVAILABLE, a deadline) the next endpoint is tried, so a client follows
the cluster through the loss of any minority of members. A cluster without
quorum answers nobody: the call fails with :class:`EtcdUnavailableError`,
naming each endpoint and what it said.

TLS and authentication (:class:`EtcdSecurity`) are etcd's own: channels are
gRPC secure channels when ``tls`` is set, and with a user every call
carries the ``token`` metadata that Auth.Authenticate returned (any member
accepts it: etcd assigns tokens through raft). The client authenticates on
its first call and again when etcd says the token is no longer valid (an
unused token expires, after 5 minutes by default). A failed TLS
handshake and a refused password raise errors of their own
(:class:`EtcdTlsError`, :class:`EtcdAuthError`) instead of looking like a
cluster that is down.

Example::

    client = EtcdClient(["h1:2379", "h2:2379", "h3:2379"])
    client.put(b"/a", b"1")
    kvs, revision = client.range(b"/a")
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Self

import grpc

from kungfu_tf.proto import etcd_rpc_pb2 as pb
from kungfu_tf.proto import etcd_rpc_pb2_grpc as pb_grpc
from kungfu_tf.run.control.etcd_security import EtcdSecurity

__all__ = ["EtcdAuthError", "EtcdClient", "EtcdError", "EtcdTlsError", "EtcdUnavailableError", "prefix_end"]

# Bound on one call to one member; a member that takes longer is treated as
# down and the next is asked (etcd answers within milliseconds when healthy,
# and within its election timeout when a leader is being elected).
CALL_SECONDS = 3.0

# Status codes that mean "this member cannot serve now": ask another.
_RETRY_ELSEWHERE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNKNOWN,  # etcd 3.4 answers "etcdserver: leader changed" / "request timed out" so
}


class EtcdError(Exception):
    """etcd refused a call (the message names the call, the status and etcd's reason)."""


class EtcdUnavailableError(EtcdError):
    """No etcd member could serve a call (down, unreachable, or without quorum)."""


class EtcdTlsError(EtcdUnavailableError):
    """No member could be reached because the TLS handshake failed (wrong CA, no or wrong
    client certificate, or TLS on one side only)."""


class EtcdAuthError(EtcdError):
    """etcd refused the user and password, or needs them and none were given."""


# What a gRPC status detail says when the TLS handshake, not the member, failed.
_HANDSHAKE_SIGNS = ("handshake", "ssl_error", "certificate", "tsi_")  # TSI: gRPC's transport security layer
# etcd's answers that concern credentials (api/v3rpc/rpctypes: ErrGRPCAuthFailed,
# ErrGRPCUserEmpty, ErrGRPCInvalidAuthToken).
_AUTH_FAILED = "authentication failed"
_USER_EMPTY = "user name is empty"
_INVALID_TOKEN = "invalid auth token"


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``.

    Example:
        >>> prefix_end(b"/kungfu/job/")
        b'/kungfu/job0'
    """
    end = bytearray(prefix)
    for i in reversed(range(len(end))):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"  # every key


class EtcdClient:
    """Calls to an etcd cluster given as ``host:port`` endpoints (any member serves any call).

    Example::

        with EtcdClient(["127.0.0.1:2379"]) as etcd:
            lease = etcd.grant_lease(5)
            etcd.put(b"/x", b"y", lease=lease)
    """

    def __init__(
        self, endpoints: Sequence[str], *, call_seconds: float = CALL_SECONDS, security: EtcdSecurity | None = None
    ):
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self._endpoints = list(endpoints)
        self._call_seconds = call_seconds
        self._security = security or EtcdSecurity()
        if self._security.tls:
            credentials = grpc.ssl_channel_credentials(self._security.ca, self._security.key, self._security.cert)
            self._channels = [grpc.secure_channel(e, credentials) for e in self._endpoints]
        else:
            self._channels = [grpc.insecure_channel(e) for e in self._endpoints]
        self._token: str | None = None  # from Auth.Authenticate, when a user is given
        self._current = 0
        self._lock = threading.Lock()

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints)

    def close(self) -> None:
        for c in self._channels:
            c.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing

    def _call(self, stub_type, method: str, request, timeout: float | None = None, *, streamed: bool = False):
        """``method`` on the current member; on a member that cannot serve, the others in turn.

        ``streamed``: ``request`` is a request stream; the answer is the first
        message of the response stream (read here, so its errors are retried too).

        Raises:
            EtcdUnavailableError: no member could serve.
            EtcdError: a member refused the call for another reason.
        """
        problems = []
        with self._lock:
            start = self._current
        for k in range(len(self._channels)):
            i = (start + k) % len(self._channels)
            stub = stub_type(self._channels[i])
            for attempt in range(2):  # a second time only after a fresh token
                try:
                    response = getattr(stub, method)(
                        request() if streamed else request, timeout=timeout or self._call_seconds, metadata=self._metadata(i)
                    )
                    if streamed:
                        response = next(iter(response), None)
                except grpc.RpcError as e:
                    if attempt == 0 and self._token_expired(e.details()):
                        continue
                    if e.code() not in _RETRY_ELSEWHERE:
                        raise self._refusal(method, e) from None
                    problems.append(f"{self._endpoints[i]}: {e.code().name} {e.details()}")
                    break
                with self._lock:
                    self._current = i
                return response
        raise self._unavailable(method, problems)

    def _metadata(self, i: int) -> tuple[tuple[str, str], ...]:
        """The ``token`` metadata for a call (authenticating with member ``i`` first if needed)."""
        if not self._security.authenticates:
            return ()
        token = self._token
        if token is None:
            token = self._authenticate(i)
        return (("token", token),)

    def _authenticate(self, i: int) -> str:
        """A token from member ``i`` for the configured user.

        Raises:
            grpc.RpcError: the member cannot serve (the caller tries another).
            EtcdAuthError: etcd refused the user or password.
        """
        security = self._security
        request = pb.AuthenticateRequest(name=security.user or "", password=security.password or "")
        try:
            token = pb_grpc.AuthStub(self._channels[i]).Authenticate(request, timeout=self._call_seconds).token
        except grpc.RpcError as e:
            if e.code() in _RETRY_ELSEWHERE:
                raise
            raise EtcdAuthError(
                f"etcd authentication failed for user {security.user!r} with {security.password_source} "
                f"({self._endpoints[i]}: {e.code().name} {e.details()})"
            ) from None
        self._token = token
        return token

    def _token_expired(self, reason: str | None) -> bool:
        """Whether etcd refused a call (``reason``: what it said) only because the token
        is stale; then it is dropped, and the next call authenticates again."""
        if self._security.authenticates and _INVALID_TOKEN in (reason or ""):
            self._token = None
            return True
        return False

    def _refusal(self, method: str, error: grpc.RpcError) -> EtcdError:
        details = error.details() or ""
        if _USER_EMPTY in details or _AUTH_FAILED in details:
            return EtcdAuthError(
                f"etcd refused {method}: {error.code().name} {details} (authentication is enabled on this "
                "cluster: give a user and password, --config-store-user and KUNGFU_CONFIG_STORE_PASSWORD "
                "or --config-store-password-file)"
            )
        return EtcdError(f"etcd refused {method}: {error.code().name} {details}")

    def _unavailable(self, method: str, problems: list[str]) -> EtcdUnavailableError:
        said = "; ".join(problems)
        if any(sign in problem.lower() for problem in problems for sign in _HANDSHAKE_SIGNS):
            if self._security.tls:
                cause = (
                    f"check that {self._security.ca_source} signed the members' certificates (and that they "
                    "name the host dialled), and, if etcd runs with --client-cert-auth, that the client "
                    "certificate and key are given and signed by a CA it trusts"
                )
            else:
                cause = "the members serve TLS: name them as etcds://... (with --config-store-ca)"
            return EtcdTlsError(f"TLS handshake with etcd failed for {method} ({said}): {cause}")
        hint = ""
        if not self._security.tls and any("socket closed" in problem.lower() for problem in problems):
            # A TLS member drops a plaintext client without a word gRPC could show.
            hint = " (a member that closes the connection at once may serve TLS only: name it etcds://...)"
        return EtcdUnavailableError(
            f"no etcd member served {method} ({said}); the cluster is down or has no quorum{hint}"
        )

    # ------------------------------------------------------------------ KV

    def range(self, key: bytes, range_end: bytes = b"", *, descending: bool = False, limit: int = 0):
        """The key-values in ``[key, range_end)`` (just ``key`` if no end) and the store's revision."""
        request = pb.RangeRequest(key=key, range_end=range_end, limit=limit)
        if descending:
            request.sort_order = pb.RangeRequest.DESCEND
            request.sort_target = pb.RangeRequest.KEY
        response = self._call(pb_grpc.KVStub, "Range", request)
        return list(response.kvs), response.header.revision

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Writes ``key``; returns the store's revision after it."""
        return self._call(pb_grpc.KVStub, "Put", pb.PutRequest(key=key, value=value, lease=lease)).header.revision

    def delete(self, key: bytes, range_end: bytes = b"") -> int:
        """Deletes ``key`` (or ``[key, range_end)``); returns how many keys went."""
        return self._call(pb_grpc.KVStub, "DeleteRange", pb.DeleteRangeRequest(key=key, range_end=range_end)).deleted

    def txn(
        self,
        compare: Sequence[pb.Compare],
        success: Sequence[pb.RequestOp],
        failure: Sequence[pb.RequestOp] = (),
    ) -> pb.TxnResponse:
        """An atomic if-then-else (``succeeded`` says which branch ran)."""
        return self._call(pb_grpc.KVStub, "Txn", pb.TxnRequest(compare=compare, success=success, failure=failure))

    def put_if_absent(self, key: bytes, value: bytes, *, lease: int = 0) -> bool:
        """Writes ``key`` only if it does not exist; whether it did."""
        compare = pb.Compare(key=key, target=pb.Compare.CREATE, result=pb.Compare.EQUAL, create_revision=0)
        put = pb.RequestOp(request_put=pb.PutRequest(key=key, value=value, lease=lease))
        return self.txn([compare], [put]).succeeded

    # -------------------------------------------------------------- leases

    def grant_lease(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        response = self._call(pb_grpc.LeaseStub, "LeaseGrant", pb.LeaseGrantRequest(TTL=ttl))
        if response.error:
            raise EtcdUnavailableError(f"etcd refused a lease: {response.error}")
        return response.ID

    def keep_alive(self, lease: int) -> int:
        """Renews ``lease``; its remaining TTL in seconds (<= 0: it expired, keys under it are gone)."""
        answer = self._call(
            pb_grpc.LeaseStub, "LeaseKeepAlive", lambda: _single(pb.LeaseKeepAliveRequest(ID=lease)), streamed=True
        )
        return answer.TTL if answer is not None else 0

    def revoke_lease(self, lease: int) -> None:
        """Ends ``lease`` now (its keys are deleted at once)."""
        self._call(pb_grpc.LeaseStub, "LeaseRevoke", pb.LeaseRevokeRequest(ID=lease))

    # --------------------------------------------------------------- watch

    def watch(self, key: bytes, range_end: bytes, start_revision: int) -> EtcdWatch:
        """Events on ``[key, range_end)`` from ``start_revision`` on (see :class:`EtcdWatch`)."""
        return EtcdWatch(self, key, range_end, start_revision)

    def _open_watch(self, key: bytes, range_end: bytes, start_revision: int, closed: threading.Event):
        """A Watch stream on the current member (the caller reopens it on another if it breaks);
        its request stream stays open until ``closed`` is set."""
        with self._lock:
            i = self._current
            self._current = (i + 1) % len(self._channels)  # a broken stream moves to the next member
        create = pb.WatchRequest(
            create_request=pb.WatchCreateRequest(key=key, range_end=range_end, start_revision=start_revision)
        )
        try:
            metadata = self._metadata(i)
        except grpc.RpcError:
            metadata = ()  # the member is down: the stream fails at once and is reopened on the next one
        return pb_grpc.WatchStub(self._channels[i]).Watch(_single(create, until=closed), metadata=metadata)

    # ------------------------------------------------------------- cluster

    def status(self, endpoint: int) -> pb.StatusResponse:
        """Member ``endpoint``'s own status (leader id, raft term)."""
        return pb_grpc.MaintenanceStub(self._channels[endpoint]).Status(pb.StatusRequest(), timeout=self._call_seconds)


class EtcdWatch:
    """A watch that survives its member: iterate it for revisions at which ``[key, end)`` changed.

    Each item is the revision of a batch of events; a broken stream is
    reopened (on the next member) from the revision after the last seen, so
    no change is missed (a 0 then says "look again"). :meth:`cancel` ends
    the iteration.

    Example::

        watch = client.watch(b"/kungfu/job/state/", prefix_end(b"/kungfu/job/state/"), revision + 1)
        for _ in watch:      # in a thread of its own; watch.cancel() from another ends it
            reload_state()
    """

    def __init__(self, client: EtcdClient, key: bytes, range_end: bytes, start_revision: int):
        self._client = client
        self._key, self._end = key, range_end
        self._next = start_revision
        self._stream = None
        self._closed: threading.Event | None = None
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def cancel(self) -> None:
        self._cancelled.set()
        with self._lock:
            if self._stream is not None:
                self._stream.cancel()
            if self._closed is not None:
                self._closed.set()

    def __iter__(self) -> Iterator[int]:
        while not self._cancelled.is_set():
            closed = threading.Event()
            with self._lock:
                self._closed = closed
                self._stream = stream = self._client._open_watch(self._key, self._end, self._next, closed)
            try:
                for response in stream:
                    if response.canceled:
                        # Compacted: reopen from what is there now. A stale token: etcd
                        # cancels the watch (no gRPC error); reopen with a fresh one.
                        self._client._token_expired(response.cancel_reason)
                        break
                    if response.events:
                        self._next = response.events[-1].kv.mod_revision + 1
                        yield response.header.revision
            except grpc.RpcError as e:
                self._client._token_expired(e.details())  # then the reopened stream gets a fresh token
                # else the member went away: reopen on another
            finally:
                closed.set()
            if not self._cancelled.is_set():
                self._cancelled.wait(0.2)
                yield 0  # "look again": the caller re-reads (a change may have been missed while reconnecting)


def _single(request, *, until: threading.Event | None = None) -> Iterator:
    """A request stream of one message, held open until ``until`` is set (if given)."""
    yield request
    if until is not None:
        until.wait()
