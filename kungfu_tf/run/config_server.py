"""In-memory gRPC ConfigService (proto/config.proto): the job's membership.

The launcher runs one ConfigServer per job; launchers and workers use
ConfigClient to read the current Cluster and, on an elastic resize, to replace
it. PutCluster is a compare-and-swap on Cluster.version (the new version must
be the current one + 1), so two launchers cannot both apply a resize.

Every call is authenticated both ways by challenge-response keyed with the
job secret (kungfu_tf/run/config_auth.py): the secret itself never crosses
the wire, a wrong or missing proof gets PERMISSION_DENIED, and ConfigClient
refuses an answer from a server that cannot prove it holds the secret. The
channel is not encrypted: cluster contents are visible, not forgeable.
``job_id`` (the same on server and clients) binds the proofs to one job, so
two jobs that share a secret cannot serve each other's clients.

Example::

    server = ConfigServer(secret=secret, job_id=job_id, host="0.0.0.0")
    server.start()
    with ConfigClient(f"{host}:{server.port}", secret=secret, job_id=job_id) as client:
        current = client.get_cluster()
        client.put_cluster(make_cluster(current.version + 1, [("10.0.0.1", 10000)]))
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent import futures
from typing import Self

import grpc

from kungfu_tf.proto import config_pb2, config_pb2_grpc
from kungfu_tf.run.config_auth import (
    MAC_METADATA_KEY,
    NONCE_BYTES,
    NONCE_METADATA_KEY,
    SERVER_MAC_METADATA_KEY,
    NonceBook,
    macs_equal,
    request_mac,
    response_mac,
)

SERVICE = "/kungfu.ConfigService/"
CHALLENGE_METHOD = SERVICE + "Challenge"

__all__ = ["ConfigClient", "ConfigServer", "ServerNotAuthenticatedError", "make_cluster"]


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
    version: int, workers: Iterable[tuple[str, int] | config_pb2.PeerID]
) -> config_pb2.Cluster:
    """Builds a Cluster from (host, port) pairs (or PeerIDs), in rank order."""
    cluster = config_pb2.Cluster(version=version)
    for w in workers:
        if isinstance(w, config_pb2.PeerID):
            cluster.workers.add().CopyFrom(w)
        else:
            host, port = w
            cluster.workers.add(host=host, port=port)
    return cluster


def _validate(cluster: config_pb2.Cluster) -> str | None:
    """Returns why `cluster` is malformed, or None if it is fine."""
    seen = set()
    for rank, w in enumerate(cluster.workers):
        if not w.host:
            return f"workers[{rank}] has an empty host"
        if not 1 <= w.port <= 65535:
            return (
                f"workers[{rank}] ({w.host}) has invalid port {w.port} (want 1..65535)"
            )
        if (w.host, w.port) in seen:
            return f"workers[{rank}] {w.host}:{w.port} appears more than once"
        seen.add((w.host, w.port))
    return None


class _Servicer(config_pb2_grpc.ConfigServiceServicer):
    def __init__(self, initial: config_pb2.Cluster, nonces: NonceBook):
        self._lock = threading.Lock()
        self._cluster = config_pb2.Cluster()
        self._cluster.CopyFrom(initial)
        self._nonces = nonces

    def Challenge(self, request, context):
        return config_pb2.ChallengeResponse(nonce=self._nonces.issue())

    def snapshot(self) -> config_pb2.Cluster:
        out = config_pb2.Cluster()
        with self._lock:
            out.CopyFrom(self._cluster)
        return out

    def GetCluster(self, request, context):
        return self.snapshot()

    def PutCluster(self, request, context):
        if not request.HasField("cluster"):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "PutCluster: missing cluster"
            )
        new = request.cluster
        problem = _validate(new)
        if problem is not None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"PutCluster: {problem}")
        with self._lock:
            current = self._cluster.version
            if new.version != current + 1:
                # context.abort raises, which releases the lock.
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"PutCluster: version conflict: the cluster is at version {current}, "
                    f"so the new cluster must have version {current + 1}, "
                    f"got {new.version}; re-read it with GetCluster and retry",
                )
            self._cluster.CopyFrom(new)
        return config_pb2.PutClusterResponse(cluster=new)


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

        def deny(context, why: str):
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{method}: {why} (challenge-response with the job secret failed)",
            )

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
      max_workers: size of the gRPC handler thread pool.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        secret: str | bytes,
        job_id: str = "",
        host: str = "127.0.0.1",
        cluster: config_pb2.Cluster | None = None,
        max_workers: int = 4,
    ):
        self._secret = _secret_bytes(secret)
        self._job_id = job_id
        self._host = host
        self.port = port
        self._max_workers = max_workers
        initial = cluster if cluster is not None else config_pb2.Cluster()
        problem = _validate(initial)
        if problem is not None:
            raise ValueError(f"initial cluster: {problem}")
        self._nonces = NonceBook()
        self._servicer = _Servicer(initial, self._nonces)
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

    def start(self) -> Self:
        if self._server is not None:
            raise RuntimeError("ConfigServer already started")
        server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="kungfu-config"
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
        self.port = port
        server.start()
        self._server = server
        return self

    def stop(self, grace: float | None = None) -> None:
        """Stops serving; in-flight calls get `grace` seconds to finish."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace).wait()

    def get_cluster(self) -> config_pb2.Cluster:
        """The current Cluster, read locally (no RPC, no secret needed)."""
        return self._servicer.snapshot()

    def __enter__(self) -> Self:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class ConfigClient:
    """Client for a ConfigServer at `address` ("host:port").

    Each call first fetches a challenge, then sends the call with its proof
    (see config_auth); the job secret is never sent.

    Failed calls raise grpc.RpcError; check .code():
      PERMISSION_DENIED    wrong job secret or job id
      UNAUTHENTICATED      the server could not prove it holds the job secret
                           (ServerNotAuthenticatedError)
      FAILED_PRECONDITION  put_cluster version conflict (re-read and retry)
      INVALID_ARGUMENT     malformed cluster
      UNAVAILABLE          server unreachable
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

    def _call(self, name: str, request, response_type):
        method = SERVICE + name
        nonce = self._challenge(config_pb2.ChallengeRequest(), timeout=self._timeout).nonce
        raw_request = request.SerializeToString()
        proof = request_mac(self._key, nonce, method, self._job_id, raw_request)
        # Bytes in and out, so that both proofs cover exactly what travelled.
        raw_response, call = self._channel.unary_unary(method).with_call(
            raw_request,
            metadata=((NONCE_METADATA_KEY, nonce.hex()), (MAC_METADATA_KEY, proof)),
            timeout=self._timeout,
        )
        expected = response_mac(self._key, nonce, method, self._job_id, raw_response)
        proofs = [v for k, v in (call.trailing_metadata() or ()) if k == SERVER_MAC_METADATA_KEY]
        if len(proofs) != 1 or not macs_equal(expected, proofs[0]):
            raise ServerNotAuthenticatedError(self._address, method)
        return response_type.FromString(raw_response)

    def get_cluster(self) -> config_pb2.Cluster:
        return self._call("GetCluster", config_pb2.GetClusterRequest(), config_pb2.Cluster)

    def put_cluster(self, cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        """Stores `cluster` if cluster.version == current version + 1.

        Returns the stored cluster; raises grpc.RpcError with
        FAILED_PRECONDITION if another writer got there first.
        """
        request = config_pb2.PutClusterRequest(cluster=cluster)
        return self._call("PutCluster", request, config_pb2.PutClusterResponse).cluster

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
