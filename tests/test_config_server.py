"""Tests for kungfu_tf.run.control.config_server (gRPC control plane)."""

import contextlib
import socket
import threading
import time
from concurrent import futures

import grpc
import pytest
from waiting import HANG_BOUND_SECONDS, NEVER_SECONDS, eventually, returns

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control import config_server, job_state
from kungfu_tf.run.control.config_auth import (
    MAC_METADATA_KEY,
    NONCE_METADATA_KEY,
    SERVER_MAC_METADATA_KEY,
    NonceBook,
    request_mac,
)
from kungfu_tf.run.control.config_server import (
    CHALLENGE_METHOD,
    ConfigClient,
    ConfigServer,
    ServerNotAuthenticatedError,
    cluster_peers,
    make_cluster,
    parse_peer_string,
    peer_string,
)
from kungfu_tf.run.control.job_state import job_finished

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


# ------------------------------------------------------------------ elastic RPCs

SIG = "dense/kernel (784, 10) float32\ndense/bias (10,) float32"
OTHER_SIG = "dense/kernel (784, 10) float32\ndense/bias (12,) float32"
NEW_METHODS = [
    "GetJobState",
    "WaitJobState",
    "GetClusterAt",
    "RequestSize",
    "ReportLost",
    "AddJoiner",
    "JoinerReady",
    "SetSignature",
    "RemoveJoiner",
    "ReportFinished",
]


@pytest.fixture
def elastic_server():
    srv = ConfigServer(
        secret=SECRET, elastic=True, max_size=8, cluster=make_cluster(1, ["127.0.0.1:10001", "127.0.0.1:10002"])
    ).start()
    yield srv
    srv.stop()


@pytest.fixture
def elastic_client(elastic_server):
    with ConfigClient(elastic_server.address, secret=SECRET, timeout=5.0) as c:
        yield c


def peers_of(cluster):
    return [f"{w.host}:{w.port}" for w in cluster.workers]


def test_elastic_grow_crash_and_history_over_grpc(elastic_server, elastic_client):
    c = elastic_client
    state = c.get_job_state()
    assert (state.target_size, state.min_size, state.max_size, state.state_version) == (2, 1, 8, 1)
    assert c.set_signature(SIG).signature == SIG
    assert c.request_size(4).target_size == 4
    c.add_joiner("127.0.0.1:10003")
    c.add_joiner("[::1]:10004")
    state = c.joiner_ready("[::1]:10004", SIG)
    assert peers_of(state.cluster) == ["127.0.0.1:10001", "127.0.0.1:10002", "::1:10004"]
    assert [j.state for j in state.joiners] == [config_pb2.Joiner.STARTING]
    rejected = c.joiner_ready("127.0.0.1:10003", OTHER_SIG).joiners[0]
    assert rejected.state == config_pb2.Joiner.REJECTED and "line 2" in rejected.reason
    assert c.remove_joiner("127.0.0.1:10003").joiners == []
    state = c.report_lost(2, ["127.0.0.1:10002"], "killed by SIGKILL")
    assert peers_of(state.cluster) == ["127.0.0.1:10001", "::1:10004"] and state.cluster.version == 3
    assert state.target_size == 3
    assert c.report_lost(2, ["127.0.0.1:10002"], "connection reset") == state  # second report: no-op
    assert elastic_server.commit_reason(3) == "lost 127.0.0.1:10002: killed by SIGKILL"
    assert peers_of(c.get_cluster_at(1)) == ["127.0.0.1:10001", "127.0.0.1:10002"]
    assert c.get_cluster_at(3) == c.get_cluster() == elastic_server.get_cluster()
    assert elastic_server.job_state() == c.get_job_state()
    # PutCluster sets the target size in an elastic job.
    c.put_cluster(make_cluster(4, ["127.0.0.1:10001"]))
    assert c.get_job_state().target_size == 1


def test_finished_members_over_grpc(elastic_server, elastic_client):
    c = elastic_client
    state = c.report_finished("127.0.0.1:10002")
    assert peers_of(config_pb2.Cluster(workers=state.finished)) == ["127.0.0.1:10002"]
    assert state.cluster.version == 1 and not job_finished(state)
    # Its peers' crash report about it is ignored: a finished member is not lost.
    assert c.report_lost(1, ["127.0.0.1:10002"], "connection reset") == state
    state = c.report_finished("127.0.0.1:10001")
    assert job_finished(state) and state == elastic_server.job_state()


@pytest.mark.parametrize(
    "call, code, message",
    [
        (lambda c: c.request_size(9), "OUT_OF_RANGE", "RequestSize: requested size 9 is outside [min_size=1, max_size=8]"),
        (lambda c: c.put_cluster(make_cluster(2, [])), "OUT_OF_RANGE", "PutCluster: the new cluster has 0 workers"),
        (lambda c: c.get_cluster_at(5), "NOT_FOUND", "GetClusterAt: cluster version 5 was never committed"),
        (lambda c: c.report_lost(1, ["h:1"]), "INVALID_ARGUMENT", "ReportLost: h:1 is not a member of cluster version 1"),
        (lambda c: c.report_lost(9, ["h:1"]), "INVALID_ARGUMENT", "ReportLost: reported version 9 was never committed"),
        (lambda c: c.add_joiner("127.0.0.1:10001"), "ALREADY_EXISTS", "AddJoiner: 127.0.0.1:10001 is already a member"),
        (lambda c: c.remove_joiner("h:1"), "NOT_FOUND", "RemoveJoiner: h:1 is not a joiner"),
        (lambda c: c.report_finished("h:1"), "FAILED_PRECONDITION",
         "ReportFinished: h:1 is not a member of the current cluster version 1"),
        (lambda c: c.joiner_ready("h:3", ""), "INVALID_ARGUMENT", "JoinerReady: empty model signature"),
        (lambda c: c.wait_job_state(99, 1), "INVALID_ARGUMENT", "WaitJobState: after_state_version 99 is ahead"),
    ],
)
def test_elastic_errors_map_to_status_codes(elastic_client, call, code, message):
    with pytest.raises(grpc.RpcError) as err:
        call(elastic_client)
    assert err.value.code() == getattr(grpc.StatusCode, code)
    assert message in err.value.details()


def test_signature_mismatch_is_failed_precondition(elastic_client):
    elastic_client.set_signature(SIG)
    with pytest.raises(grpc.RpcError) as err:
        elastic_client.set_signature(OTHER_SIG)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "SetSignature: the model signature differs from the job's at line 2" in err.value.details()


def test_elastic_calls_to_a_plain_server_fail_precondition(client):
    with pytest.raises(grpc.RpcError) as err:
        client.request_size(2)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "RequestSize needs an elastic job (kungfu-run --elastic" in err.value.details()
    assert client.get_job_state().cluster.version == 0  # reads work


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda c: c.add_joiner("no-port"), ValueError, "peer: bad peer address 'no-port'"),
        (lambda c: c.report_finished("h"), ValueError, "peer: bad peer address 'h'"),
        (lambda c: c.report_lost(1, ["h:1", "h:0"]), ValueError, "peers[1]: bad peer address 'h:0'"),
        (lambda c: c.report_lost(1, "h:1"), TypeError, "not the string 'h:1'"),
        (lambda c: c.request_size(-1), ValueError, "n must be an integer in 0..4294967295, got -1"),
        (lambda c: c.get_cluster_at(1.0), ValueError, "version must be an integer"),
        (lambda c: c.wait_job_state(0, -1), ValueError, "timeout must be a number of seconds >= 0, got -1"),
    ],
)
def test_client_checks_arguments(elastic_client, call, error, message):
    with pytest.raises(error) as err:
        call(elastic_client)
    assert message in str(err.value)


@pytest.mark.parametrize("method", NEW_METHODS)
def test_new_rpcs_deny_unauthenticated_calls(elastic_server, method):
    address = elastic_server.address
    before = elastic_server.job_state()
    body = config_pb2.RequestSizeRequest(size=5).SerializeToString() if method == "RequestSize" else b""
    path = f"/kungfu.ConfigService/{method}"
    assert_denied(address, path, body, None)
    assert_denied(address, path, body, proof_metadata(address, path, body, secret=SECRET + "x"))
    assert_denied(address, path, body, proof_metadata(address, path, body, job_id="other-job"))
    assert elastic_server.job_state() == before


def test_new_client_calls_with_a_wrong_secret_are_denied(elastic_server):
    with ConfigClient(elastic_server.address, secret="wrong", timeout=5.0) as intruder:
        for call in [
            lambda: intruder.get_job_state(),
            lambda: intruder.wait_job_state(0, 1),
            lambda: intruder.get_cluster_at(1),
            lambda: intruder.request_size(5),
            lambda: intruder.report_lost(1, ["127.0.0.1:10001"]),
            lambda: intruder.add_joiner("h:9"),
            lambda: intruder.joiner_ready("h:9", SIG),
            lambda: intruder.set_signature(SIG),
            lambda: intruder.remove_joiner("h:9"),
            lambda: intruder.report_finished("127.0.0.1:10001"),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                call()
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert elastic_server.job_state().state_version == 1


def long_waits(monkeypatch) -> None:
    """Let polls wait an hour (client and server caps): then only the event
    a test waits for can end one within the hang bound, however slow the host."""
    monkeypatch.setattr(config_server, "MAX_WAIT_SECONDS", NEVER_SECONDS)
    monkeypatch.setattr(job_state, "MAX_WAIT_SECONDS", NEVER_SECONDS)


def test_long_poll_wakes_on_a_change_and_returns_at_the_timeout(elastic_server, elastic_client, monkeypatch):
    long_waits(monkeypatch)
    c = elastic_client
    got = {}

    def poll():
        got["state"] = c.wait_job_state(1, NEVER_SECONDS)

    waiter = threading.Thread(target=poll, daemon=True)
    waiter.start()
    assert eventually(lambda: elastic_server.long_polls_waiting == 1)  # it waits in the server
    assert "state" not in got
    c.request_size(5)
    waiter.join(HANG_BOUND_SECONDS)
    assert not waiter.is_alive(), "the poll was not woken by the change"  # its timeout is an hour
    assert got["state"].target_size == 5

    state_version = got["state"].state_version
    start = time.monotonic()
    state = returns(lambda: c.wait_job_state(state_version, 0.5))  # ends at its timeout (the cap is an hour)
    assert time.monotonic() - start >= 0.45 and state.state_version == state_version
    # Already newer: at once (an hour's timeout could not end it in time).
    assert returns(lambda: c.wait_job_state(0, NEVER_SECONDS)).state_version == state_version


def test_long_poll_timeout_is_capped_by_the_server(elastic_server, monkeypatch):
    monkeypatch.setattr(config_server, "MAX_WAIT_SECONDS", 0.3)
    method = "/kungfu.ConfigService/WaitJobState"
    body = config_pb2.WaitJobStateRequest(after_state_version=1, timeout_ms=2**32 - 1).SerializeToString()
    start = time.monotonic()
    raw = raw_call(elastic_server.address, method, body, proof_metadata(elastic_server.address, method, body))
    assert config_pb2.JobState.FromString(raw).state_version == 1
    assert time.monotonic() - start < HANG_BOUND_SECONDS  # capped at 0.3 s, not the ~50 days asked for


def test_64_long_polls_do_not_starve_other_calls(elastic_server, elastic_client, monkeypatch):
    long_waits(monkeypatch)  # only a change or the hang bound can end a poll
    n = 64
    woken = []
    lock = threading.Lock()

    def poll():
        state = elastic_client.wait_job_state(1, NEVER_SECONDS)
        with lock:
            woken.append(state.target_size)

    threads = [threading.Thread(target=poll, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    assert eventually(lambda: elastic_server.long_polls_waiting == n)  # all 64 wait in the server
    assert woken == []

    def short_calls() -> None:
        for _ in range(3):  # each with its Challenge, beside the polls
            elastic_client.get_cluster()
            elastic_client.get_job_state()

    returns(short_calls)  # served, not queued behind the polls (an hour)
    assert woken == []
    elastic_client.request_size(6)
    assert eventually(lambda: len(woken) == n), f"{len(woken)} of {n} polls woken"  # not their hour
    assert all(size == 6 for size in woken)


def test_long_polls_beyond_the_limit_are_refused_and_cancelled_ones_free_their_slot():
    with ConfigServer(secret=SECRET, elastic=True, cluster=make_cluster(1, ["h:1"]), max_long_polls=1) as srv:
        method = "/kungfu.ConfigService/WaitJobState"
        body = config_pb2.WaitJobStateRequest(after_state_version=1, timeout_ms=60000).SerializeToString()
        with grpc.insecure_channel(srv.address) as channel:
            # A poll that its caller will cancel ...
            pending = channel.unary_unary(method).future(
                body, metadata=proof_metadata(srv.address, method, body), timeout=30
            )
            deadline = time.monotonic() + 30
            while srv.long_polls_waiting < 1:  # it reached the server (however long that took)
                assert time.monotonic() < deadline and not pending.done(), pending
                time.sleep(0.01)
            with ConfigClient(srv.address, secret=SECRET, timeout=5.0) as c:
                with pytest.raises(grpc.RpcError) as err:
                    c.wait_job_state(1, 1)  # ... holds the only slot
                assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "WaitJobState: 1 long polls are already waiting" in err.value.details()
                assert c.get_job_state().state_version == 1  # short calls still served
                assert pending.cancel() and pending.cancelled()
                # The cancelled poll left the server at once, not after its 60 s (its timeout_ms).
                deadline = time.monotonic() + 20.0
                while True:
                    try:
                        c.wait_job_state(1, 0.1)
                        break
                    except grpc.RpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline


def test_stop_answers_long_polls_instead_of_waiting_them_out(monkeypatch):
    long_waits(monkeypatch)
    srv = ConfigServer(secret=SECRET, elastic=True, cluster=make_cluster(1, ["h:1"])).start()
    answers = []

    def poll():
        with ConfigClient(srv.address, secret=SECRET, timeout=5.0) as c:
            answers.append(c.wait_job_state(1, NEVER_SECONDS))

    waiter = threading.Thread(target=poll, daemon=True)
    waiter.start()
    assert eventually(lambda: srv.long_polls_waiting == 1)  # the poll waits in the server
    # In-flight calls may finish: the poll answers at once. Its timeout and
    # the grace are an hour, so stop() returns in time only if it answered.
    returns(lambda: srv.stop(grace=NEVER_SECONDS))
    waiter.join(HANG_BOUND_SECONDS)
    assert [a.state_version for a in answers] == [1]


def test_concurrent_report_lost_commits_once(elastic_server):
    n = 8
    barrier = threading.Barrier(n)
    states = [None] * n

    def report(i):
        with ConfigClient(elastic_server.address, secret=SECRET) as c:
            barrier.wait()
            states[i] = c.report_lost(1, ["127.0.0.1:10002"], f"seen by reporter {i}")

    threads = [threading.Thread(target=report, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s.cluster.version == 2 and peers_of(s.cluster) == ["127.0.0.1:10001"] for s in states)
    assert elastic_server.get_cluster().version == 2 and elastic_server.job_state().state_version == 2


def test_concurrent_puts_on_an_elastic_server_exactly_one_wins(elastic_server):
    n = 8
    barrier = threading.Barrier(n)
    results = [None] * n

    def attempt(i):
        with ConfigClient(elastic_server.address, secret=SECRET) as c:
            barrier.wait()
            try:
                c.put_cluster(make_cluster(2, [f"host-{i}:{1000 + i}"]))
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
    assert peers_of(elastic_server.get_cluster()) == [f"host-{winner}:{1000 + winner}"]
    assert elastic_server.job_state().target_size == 1


def test_concurrent_joiner_ready_admissions_never_exceed_the_target(elastic_server, elastic_client):
    elastic_client.set_signature(SIG)
    elastic_client.request_size(5)
    n = 12
    barrier = threading.Barrier(n)

    def ready(i):
        with ConfigClient(elastic_server.address, secret=SECRET) as c:
            barrier.wait()
            c.joiner_ready(f"127.0.0.1:{11000 + i}", SIG)

    threads = [threading.Thread(target=ready, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = elastic_client.get_job_state()
    assert len(state.cluster.workers) == 5
    for version in range(1, state.cluster.version + 1):
        assert len(elastic_client.get_cluster_at(version).workers) <= 5
    assert len(state.joiners) == n - 3
    assert all(j.state == config_pb2.Joiner.READY for j in state.joiners)


def test_peer_helpers_are_exported():
    assert peer_string(parse_peer_string("[::1]:5")) == "[::1]:5"
    assert cluster_peers(make_cluster(1, ["[::1]:5", ("h", 6)])) == ["[::1]:5", "h:6"]
