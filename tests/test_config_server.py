"""Tests for kungfu_tf.run.config_server (gRPC control plane)."""

import threading

import grpc
import pytest

from kungfu_tf.proto import config_pb2, config_pb2_grpc
from kungfu_tf.run.config_server import (
    SECRET_METADATA_KEY,
    ConfigClient,
    ConfigServer,
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


def test_missing_cluster_rejected(server):
    with grpc.insecure_channel(server.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.PutCluster(
                config_pb2.PutClusterRequest(),
                metadata=((SECRET_METADATA_KEY, SECRET),),
                timeout=5,
            )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("bad", ["wrong", SECRET + "x", SECRET[:-1], SECRET.upper()])
def test_wrong_secret_rejected(server, client, bad):
    client.put_cluster(make_cluster(1, [("a", 1)]))
    with ConfigClient(server.address, secret=bad, timeout=5.0) as intruder:
        with pytest.raises(grpc.RpcError) as err:
            intruder.get_cluster()
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert SECRET_METADATA_KEY in err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            intruder.put_cluster(make_cluster(2, [("evil", 666)]))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    got = client.get_cluster()
    assert got.version == 1 and workers(got) == [("a", 1)]


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        (("some-other-key", SECRET),),
        ((SECRET_METADATA_KEY, SECRET), (SECRET_METADATA_KEY, "wrong")),
    ],
)
def test_missing_or_ambiguous_secret_rejected(server, metadata):
    with grpc.insecure_channel(server.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        for call, request in [
            (stub.GetCluster, config_pb2.GetClusterRequest()),
            (
                stub.PutCluster,
                config_pb2.PutClusterRequest(cluster=make_cluster(1, [])),
            ),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                call(request, metadata=metadata, timeout=5)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert server.get_cluster().version == 0


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
