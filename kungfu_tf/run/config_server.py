"""In-memory gRPC ConfigService (proto/config.proto): the job's membership.

The launcher runs one ConfigServer per job; launchers and workers use
ConfigClient to read the current Cluster and, on an elastic resize, to replace
it. PutCluster is a compare-and-swap on Cluster.version (the new version must
be the current one + 1), so two launchers cannot both apply a resize.

Every call must carry the job secret as gRPC metadata ``kungfu-job-secret``
(ConfigClient does this); a missing or wrong secret gets PERMISSION_DENIED.
The channel itself is plaintext: the secret keeps other jobs and stray clients
out, it does not protect against someone who can sniff the network.

Example::

    server = ConfigServer(secret=secret, host="0.0.0.0")
    server.start()
    with ConfigClient(f"{host}:{server.port}", secret=secret) as client:
        current = client.get_cluster()
        client.put_cluster(make_cluster(current.version + 1, [("10.0.0.1", 10000)]))
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Iterable
from concurrent import futures
from typing import Self

import grpc

from kungfu_tf.proto import config_pb2, config_pb2_grpc

SECRET_METADATA_KEY = "kungfu-job-secret"

__all__ = ["SECRET_METADATA_KEY", "ConfigClient", "ConfigServer", "make_cluster"]


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
    # gRPC ASCII metadata values: printable characters only.
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
    def __init__(self, initial: config_pb2.Cluster):
        self._lock = threading.Lock()
        self._cluster = config_pb2.Cluster()
        self._cluster.CopyFrom(initial)

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


class _AuthInterceptor(grpc.ServerInterceptor):
    """Rejects calls whose kungfu-job-secret metadata is not the job secret."""

    def __init__(self, secret: bytes):
        self._secret = secret

    def _authorized(self, metadata) -> bool:
        values = [v for k, v in (metadata or ()) if k == SECRET_METADATA_KEY]
        if len(values) != 1:
            return False
        value = values[0]
        if isinstance(value, str):
            try:
                value = value.encode("ascii")
            except UnicodeEncodeError:
                return False
        return hmac.compare_digest(value, self._secret)

    def intercept_service(self, continuation, handler_call_details):
        if self._authorized(handler_call_details.invocation_metadata):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:  # unknown method: let gRPC answer UNIMPLEMENTED
            return None

        def deny(request, context):
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"missing or wrong job secret (gRPC metadata '{SECRET_METADATA_KEY}')",
            )

        if handler.request_streaming and handler.response_streaming:
            make = grpc.stream_stream_rpc_method_handler
        elif handler.request_streaming:
            make = grpc.stream_unary_rpc_method_handler
        elif handler.response_streaming:
            make = grpc.unary_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        return make(deny)  # no deserializer: never parses the request


class ConfigServer:
    """Thread-safe in-memory ConfigService.

    Args:
      port: TCP port to listen on; 0 picks a free port (read it from .port
        after start()).
      secret: the job secret clients must present (printable ASCII).
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
        host: str = "127.0.0.1",
        cluster: config_pb2.Cluster | None = None,
        max_workers: int = 4,
    ):
        self._secret = _secret_bytes(secret)
        self._host = host
        self.port = port
        self._max_workers = max_workers
        initial = cluster if cluster is not None else config_pb2.Cluster()
        problem = _validate(initial)
        if problem is not None:
            raise ValueError(f"initial cluster: {problem}")
        self._servicer = _Servicer(initial)
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
            interceptors=[_AuthInterceptor(self._secret)],
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

    Failed calls raise grpc.RpcError; check .code():
      PERMISSION_DENIED    wrong job secret
      FAILED_PRECONDITION  put_cluster version conflict (re-read and retry)
      INVALID_ARGUMENT     malformed cluster
      UNAVAILABLE          server unreachable
    """

    def __init__(self, address: str, *, secret: str | bytes, timeout: float = 10.0):
        self._metadata = ((SECRET_METADATA_KEY, _secret_bytes(secret).decode("ascii")),)
        self._timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = config_pb2_grpc.ConfigServiceStub(self._channel)

    def get_cluster(self) -> config_pb2.Cluster:
        return self._stub.GetCluster(
            config_pb2.GetClusterRequest(),
            metadata=self._metadata,
            timeout=self._timeout,
        )

    def put_cluster(self, cluster: config_pb2.Cluster) -> config_pb2.Cluster:
        """Stores `cluster` if cluster.version == current version + 1.

        Returns the stored cluster; raises grpc.RpcError with
        FAILED_PRECONDITION if another writer got there first.
        """
        response = self._stub.PutCluster(
            config_pb2.PutClusterRequest(cluster=cluster),
            metadata=self._metadata,
            timeout=self._timeout,
        )
        return response.cluster

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
