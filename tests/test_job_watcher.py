"""Tests for kungfu_tf.run.control.job_watcher (background long poll of the job state), against a real server."""

import threading

import grpc
import pytest
from waiting import eventually

from kungfu_tf.run.control.config_server import ConfigClient, ConfigServer, make_cluster
from kungfu_tf.run.control.job_watcher import JobWatcher, JobWatcherError

# The longest poll a watcher allows, and a bound below it on waiting for the
# change that ends a poll early: only a poll that was woken (or cancelled)
# ends in time, while the bound is far above what that costs (milliseconds)
# on any host, so it only rules out "waited for the poll's timeout".
POLL_SECONDS = 60
WOKEN_WITHIN_SECONDS = 50

SECRET = "s3cret-token-0123456789abcdef"


@pytest.fixture
def server():
    srv = ConfigServer(secret=SECRET, elastic=True, max_size=8, cluster=make_cluster(1, ["h:1", "h:2"])).start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server):
    with ConfigClient(server.address, secret=SECRET, timeout=5.0) as c:
        yield c


def test_latest_wait_for_and_callbacks_follow_every_change(server, client):
    seen = []
    with JobWatcher(client, on_change=seen.append, poll_timeout=POLL_SECONDS) as watcher:
        assert watcher.latest() == client.get_job_state()
        client.request_size(3)
        state = watcher.wait_for(lambda s: s.target_size == 3, timeout=WOKEN_WITHIN_SECONDS)  # woken, not the poll's 60 s
        client.report_lost(1, ["h:2"], "killed")
        state = watcher.wait_for(lambda s: s.cluster.version == 2, timeout=WOKEN_WITHIN_SECONDS)
        assert [f"{w.host}:{w.port}" for w in state.cluster.workers] == ["h:1"]
        assert watcher.latest() == server.job_state()
    # Callbacks saw each newer state once, in order.
    versions = [s.state_version for s in seen]
    assert versions == sorted(set(versions)) and versions[-1] == state.state_version
    assert seen[0].target_size == 3


def test_stop_cancels_the_poll_in_flight(server, client):
    watcher = JobWatcher(client, poll_timeout=POLL_SECONDS)
    assert eventually(lambda: server.long_polls_waiting == 1)  # the poll is waiting on the server
    watcher.stop()
    # Cancelled: the poll left the server, which only its 60 s timeout would do otherwise.
    assert eventually(lambda: server.long_polls_waiting == 0, WOKEN_WITHIN_SECONDS)
    with pytest.raises(JobWatcherError, match="stopped"):
        watcher.wait_for(lambda s: False, timeout=1)
    watcher.stop()  # idempotent


def test_wait_for_times_out_naming_the_latest_state(client):
    with JobWatcher(client) as watcher, pytest.raises(TimeoutError) as err:
        watcher.wait_for(lambda s: s.cluster.version > 1, timeout=0.3)
    assert "no job state matched within 0.3 s" in str(err.value)
    assert "cluster version 1 with 2 workers" in str(err.value)


def test_failing_callback_does_not_stop_watching(client, caplog):
    def broken(state):
        raise RuntimeError("callback bug")

    with JobWatcher(client, on_change=broken) as watcher:
        client.request_size(3)
        client.request_size(4)
        assert watcher.wait_for(lambda s: s.target_size == 4, timeout=5).target_size == 4
    assert "callback bug" in caplog.text


def test_unreachable_service_fails_the_watcher_after_the_timeout():
    srv = ConfigServer(secret=SECRET, elastic=True, cluster=make_cluster(1, ["h:1"])).start()
    with ConfigClient(srv.address, secret=SECRET, timeout=1.0) as c:
        watcher = JobWatcher(c, unreachable_timeout=0.5)
        srv.stop()
        with pytest.raises(JobWatcherError) as err:
            watcher.wait_for(lambda s: False, timeout=10)
        assert f"config service at {srv.address} was unreachable for" in str(err.value)
        assert watcher.error is err.value
        watcher.stop()


def test_closing_the_client_under_the_watcher_is_reported(server):
    c = ConfigClient(server.address, secret=SECRET, timeout=5.0)
    watcher = JobWatcher(c)
    c.close()
    with pytest.raises(JobWatcherError, match="closed"):
        watcher.wait_for(lambda s: False, timeout=5)
    watcher.stop()


def test_wrong_secret_fails_at_start(server):
    with ConfigClient(server.address, secret="wrong", timeout=5.0) as intruder, pytest.raises(grpc.RpcError) as err:
        JobWatcher(intruder)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_bad_arguments(client):
    with pytest.raises(ValueError, match="poll_timeout must be in \\(0, 60\\] seconds, got 61"):
        JobWatcher(client, poll_timeout=61)
    with pytest.raises(ValueError, match="unreachable_timeout must be > 0 seconds, got 0"):
        JobWatcher(client, unreachable_timeout=0)
    watcher = JobWatcher(client, start=False)
    with pytest.raises(RuntimeError, match="not started"):
        watcher.latest()


def test_many_watchers_on_one_server(server):
    """A launcher and 16 workers each watch; one change reaches all of them by their long poll, not their 60 s timeout."""
    with ConfigClient(server.address, secret=SECRET, timeout=5.0) as c:
        watchers = [JobWatcher(c, poll_timeout=POLL_SECONDS) for _ in range(17)]
        try:
            assert eventually(lambda: server.long_polls_waiting == 17)  # every watcher's poll waits
            c.request_size(5)
            arrived = []
            lock = threading.Lock()

            def wait(w):
                w.wait_for(lambda s: s.target_size == 5, timeout=WOKEN_WITHIN_SECONDS)  # woken, not their 60 s poll
                with lock:
                    arrived.append(w)

            threads = [threading.Thread(target=wait, args=(w,)) for w in watchers]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(arrived) == 17
        finally:
            for w in watchers:
                w.stop()
