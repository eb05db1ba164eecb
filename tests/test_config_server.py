"""Tests for kungfu_tf.run.config_server (gRPC control plane)."""

import contextlib
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.config_auth import (
    MAC_METADATA_KEY,
    NONCE_METADATA_KEY,
    SERVER_MAC_METADATA_KEY,
    NonceBook,
    request_mac,
)
from kungfu_tf.run.config_server import (
    CHALLENGE_METHOD,
    ConfigClient,
    ConfigServer,
    ServerNotAuthenticatedError,
    make_cluster,
)

SECRET = "s3cret-token-0123456789abcdef"


@pytest.fixture
def server():
    srv = ConfigServer(port=0, secret=SECRET).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with ConfigClient(server.address, secret=SECRET, timeout=5.0) as c:
        yield c


def workers(cluster):
    return [(w.host, w.port) for w in cluster.workers]


def test_port_assigned(server):
    assert server.port > 0
    assert server.address == f"127.0.0.1:{server.port}"


def test_initial_cluster_is_empty_version_0(client):
    cluster = client.get_cluster()
    assert cluster.version == 0
    assert list(cluster.workers) == []


def test_put_get_round_trip(server, client):
    peers = [("10.0.0.1", 10000), ("10.0.0.2", 10001), ("node-3", 65535)]
    stored = client.put_cluster(make_cluster(1, peers))
    assert stored.version == 1 and workers(stored) == peers

    got = client.get_cluster()
    assert got.version == 1
    assert workers(got) == peers  # order (= rank) is preserved
    assert server.get_cluster() == got

    # The next version may shrink the cluster.
    client.put_cluster(make_cluster(2, peers[:1]))
    got = client.get_cluster()
    assert got.version == 2 and workers(got) == peers[:1]


@pytest.mark.parametrize("version", [0, 1, 3, 2**64 - 1])
def test_version_cas_rejected(client, version):
    client.put_cluster(make_cluster(1, [("a", 1)]))
    with pytest.raises(grpc.RpcError) as err:
        client.put_cluster(make_cluster(version, [("b", 2)]))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details()
    assert "version conflict" in details
    assert (
        "version 1" in details
        and "version 2" in details
        and f"got {version}" in details
    )
    # Nothing changed.
    got = client.get_cluster()
    assert got.version == 1 and workers(got) == [("a", 1)]


def test_concurrent_puts_exactly_one_wins(server):
    n = 8
    barrier = threading.Barrier(n)
    results = [None] * n

    def attempt(i):
        with ConfigClient(server.address, secret=SECRET) as c:
            barrier.wait()
            try:
                c.put_cluster(make_cluster(1, [(f"host-{i}", 1000 + i)]))
                results[i] = "ok"
            except grpc.RpcError as e:
                results[i] = e.code()

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("ok") == 1
    assert results.count(grpc.StatusCode.FAILED_PRECONDITION) == n - 1
    winner = results.index("ok")
    assert workers(server.get_cluster()) == [(f"host-{winner}", 1000 + winner)]


@pytest.mark.parametrize(
    "peers, message",
    [
        ([("", 1)], "empty host"),
        ([("a", 0)], "invalid port"),
        ([("a", 65536)], "invalid port"),
        ([("a", 1), ("b", 2), ("a", 1)], "more than once"),
    ],
)
def test_invalid_cluster_rejected(client, peers, message):
    with pytest.raises(grpc.RpcError) as err:
        client.put_cluster(make_cluster(1, peers))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert client.get_cluster().version == 0


GET = "/kungfu.ConfigService/GetCluster"
PUT = "/kungfu.ConfigService/PutCluster"


def raw_call(address: str, method: str, body: bytes, metadata):
    """One call with hand-made metadata (bytes in, bytes out)."""
    with grpc.insecure_channel(address) as channel:
        return channel.unary_unary(method)(body, metadata=metadata, timeout=5)


def challenge(address: str) -> bytes:
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            CHALLENGE_METHOD,
            request_serializer=config_pb2.ChallengeRequest.SerializeToString,
            response_deserializer=config_pb2.ChallengeResponse.FromString,
        )
        return call(config_pb2.ChallengeRequest(), timeout=5).nonce


def proof_metadata(address: str, method: str, body: bytes, secret: str = SECRET, job_id: str = ""):
    nonce = challenge(address)
    mac = request_mac(secret.encode(), nonce, method, job_id, body)
    return ((NONCE_METADATA_KEY, nonce.hex()), (MAC_METADATA_KEY, mac))


def assert_denied(address: str, method: str, body: bytes, metadata) -> None:
    with pytest.raises(grpc.RpcError) as err:
        raw_call(address, method, body, metadata)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "challenge-response with the job secret failed" in err.value.details()


def test_missing_cluster_rejected(server):
    body = config_pb2.PutClusterRequest().SerializeToString()
    with pytest.raises(grpc.RpcError) as err:
        raw_call(server.address, PUT, body, proof_metadata(server.address, PUT, body))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("bad", ["wrong", SECRET + "x", SECRET[:-1], SECRET.upper()])
def test_wrong_secret_rejected(server, client, bad):
    client.put_cluster(make_cluster(1, [("a", 1)]))
    with ConfigClient(server.address, secret=bad, timeout=5.0) as intruder:
        with pytest.raises(grpc.RpcError) as err:
            intruder.get_cluster()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "challenge-response" in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            intruder.put_cluster(make_cluster(2, [("evil", 666)]))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    got = client.get_cluster()
    assert got.version == 1 and workers(got) == [("a", 1)]


def test_other_job_with_the_same_secret_is_rejected():
    with ConfigServer(secret=SECRET, job_id="job-a") as srv:
        with ConfigClient(srv.address, secret=SECRET, job_id="job-b") as other, pytest.raises(grpc.RpcError) as err:
            other.get_cluster()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with ConfigClient(srv.address, secret=SECRET, job_id="job-a") as mine:
            assert mine.get_cluster().version == 0


def test_missing_or_malformed_proof_rejected(server):
    body = config_pb2.GetClusterRequest().SerializeToString()
    good = proof_metadata(server.address, GET, body)
    nonce, mac = good[0][1], good[1][1]
    for metadata in [
        None,
        (("kungfu-job-secret", SECRET),),  # the old bearer token is no longer accepted
        ((NONCE_METADATA_KEY, nonce),),
        ((MAC_METADATA_KEY, mac),),
        ((NONCE_METADATA_KEY, "zz"), (MAC_METADATA_KEY, mac)),
        ((NONCE_METADATA_KEY, "00" * 32), (MAC_METADATA_KEY, mac)),  # never issued
        ((NONCE_METADATA_KEY, nonce), (MAC_METADATA_KEY, mac), (MAC_METADATA_KEY, mac)),
    ]:
        assert_denied(server.address, GET, body, metadata)
    assert server.get_cluster().version == 0


def test_proof_is_single_use_and_bound_to_method_and_body(server):
    put = config_pb2.PutClusterRequest(cluster=make_cluster(1, [("a", 1)])).SerializeToString()
    metadata = proof_metadata(server.address, PUT, put)
    raw_call(server.address, PUT, put, metadata)
    assert server.get_cluster().version == 1
    assert_denied(server.address, PUT, put, metadata)  # replayed

    get = config_pb2.GetClusterRequest().SerializeToString()
    assert_denied(server.address, PUT, put, proof_metadata(server.address, GET, put))  # other method
    evil = config_pb2.PutClusterRequest(cluster=make_cluster(2, [("evil", 666)])).SerializeToString()
    assert_denied(server.address, PUT, evil, proof_metadata(server.address, PUT, get))  # other body
    # A nonce that failed once is gone, even with the right proof afterwards.
    metadata = proof_metadata(server.address, PUT, evil)
    assert_denied(server.address, PUT, evil, ((metadata[0]), (MAC_METADATA_KEY, "0" * 64)))
    assert_denied(server.address, PUT, evil, metadata)
    assert server.get_cluster().version == 1


class RecordingProxy:
    """A loopback TCP proxy that keeps every byte each way."""

    def __init__(self, target_port: int):
        self._target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.to_server = bytearray()
        self.to_client = bytearray()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            threading.Thread(target=self._pump, args=(client, upstream, self.to_server), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self.to_client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, log: bytearray) -> None:
        # Either side closing ends both directions.
        with src, dst, contextlib.suppress(OSError):
            while data := src.recv(65536):
                with self._lock:
                    log += data
                dst.sendall(data)

    def close(self) -> None:
        self._listener.close()


def test_secret_never_on_the_wire(server):
    proxy = RecordingProxy(server.port)
    try:
        with ConfigClient(f"127.0.0.1:{proxy.port}", secret=SECRET, timeout=5.0) as c:
            c.put_cluster(make_cluster(1, [("a", 1)]))
            assert workers(c.get_cluster()) == [("a", 1)]
        with (
            ConfigClient(f"127.0.0.1:{proxy.port}", secret=SECRET + "x", timeout=5.0) as intruder,
            pytest.raises(grpc.RpcError),
        ):
            intruder.get_cluster()
    finally:
        proxy.close()
    sent, received = bytes(proxy.to_server), bytes(proxy.to_client)
    assert b"PutCluster" in sent and b"GetCluster" in sent  # the calls did go through the proxy
    assert MAC_METADATA_KEY.encode() in sent and SERVER_MAC_METADATA_KEY.encode() in received
    for secret in (SECRET.encode(), SECRET.encode().hex().encode(), SECRET.upper().encode()):
        assert secret not in sent and secret not in received


class ImpostorServer(grpc.GenericRpcHandler):
    """Accepts every call and answers a forged cluster, without the job secret."""

    def __init__(self, proof: str | None):
        self._proof = proof

    def service(self, handler_call_details):
        if handler_call_details.method == CHALLENGE_METHOD:
            return grpc.unary_unary_rpc_method_handler(
                lambda request, context: config_pb2.ChallengeResponse(nonce=b"n" * 32).SerializeToString()
            )

        def answer(request, context):
            if self._proof is not None:
                context.set_trailing_metadata(((SERVER_MAC_METADATA_KEY, self._proof),))
            return make_cluster(7, [("evil", 666)]).SerializeToString()

        return grpc.unary_unary_rpc_method_handler(answer)


@pytest.mark.parametrize("proof", [None, "0" * 64, "not hex"])
def test_server_without_the_secret_is_not_trusted(proof):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((ImpostorServer(proof),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with (
            ConfigClient(f"127.0.0.1:{port}", secret=SECRET, timeout=5.0) as c,
            pytest.raises(ServerNotAuthenticatedError) as err,
        ):
            c.get_cluster()
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert f"127.0.0.1:{port}" in err.value.details()
    finally:
        server.stop(None)


def test_nonces_expire_and_are_bounded():
    book = NonceBook(lifetime=0.05, capacity=8)
    old = book.issue()
    time.sleep(0.1)
    assert not book.redeem(old)
    issued = [book.issue() for _ in range(20)]
    assert [book.redeem(n) for n in issued] == [False] * 12 + [True] * 8  # oldest forgotten


def test_bytes_secret_accepted(server):
    with ConfigClient(server.address, secret=SECRET.encode(), timeout=5.0) as c:
        assert c.get_cluster().version == 0


@pytest.mark.parametrize("secret", ["", b"", "caf\u00e9", "a\nb", None])
def test_bad_secret_config_rejected(secret):
    with pytest.raises((ValueError, TypeError)):
        ConfigServer(secret=secret)
    with pytest.raises((ValueError, TypeError)):
        ConfigClient("127.0.0.1:1", secret=secret)


def test_initial_cluster():
    initial = make_cluster(5, [("h", 7)])
    with (
        ConfigServer(secret=SECRET, cluster=initial) as srv,
        ConfigClient(srv.address, secret=SECRET) as c,
    ):
        assert c.get_cluster() == initial
        c.put_cluster(make_cluster(6, []))
        assert c.get_cluster().version == 6


def test_stop_is_idempotent():
    srv = ConfigServer(secret=SECRET).start()
    srv.stop()
    srv.stop()
    srv = ConfigServer(secret=SECRET).start()
    try:
        with pytest.raises(RuntimeError):
            srv.start()
    finally:
        srv.stop()
