"""Units of kungfu_tf.elastic that need no second worker: state bytes, signatures, values, argument checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf import elastic
from kungfu_tf.elastic import session_state_transfer as sst
from kungfu_tf.elastic import state_transfer as st
from kungfu_tf.elastic.signature import model_signature
from kungfu_tf.ops.elastic_membership import NotElasticError


def test_session_variables_round_trip_as_bytes_whatever_their_dtypes():
    values = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([True, False]),
        np.array(7, np.int64),
        np.array([1.5, -2.25], dtype=tf.bfloat16.as_numpy_dtype),
    ]
    source = [tf.Variable(v) for v in values]
    target = [tf.Variable(np.zeros_like(v)) for v in values]
    data = sst.variable_bytes(source)
    assert len(data) == 24 + 2 + 8 + 4 == sst.byte_count(source)
    pieces = [data[a:b] for a, b in sst.slice_bounds(len(data), 3)]  # sent by 3 sources, joined again
    sst.assign_from_bytes(target, b"".join(pieces))
    for got, want in zip(target, values):
        np.testing.assert_array_equal(got.numpy().astype(np.float64), want.astype(np.float64))
        assert got.dtype == tf.as_dtype(want.dtype)


def test_a_wrong_number_of_bytes_is_refused_before_any_variable_changes():
    v = tf.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match="received 4 bytes of variables, this model has 8"):
        sst.assign_from_bytes([v], b"\0" * 4)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


@pytest.mark.parametrize(("total", "parts"), [(0, 1), (1, 3), (10, 3), (1000, 7)])
def test_slices_cover_the_bytes_once_in_order(total, parts):
    bounds = sst.slice_bounds(total, parts)
    assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_session_variables_hash_like_the_cpp_path():
    """A job of v1 graph variables and one of eager variables compare digests of the same layout."""
    from kungfu_tf.ops import state_sync

    variables = [tf.Variable(np.random.default_rng(1).normal(size=(1100, 1000)).astype(np.float32)), tf.Variable([3, 4])]
    assert sst.bytes_digest(sst.variable_bytes(variables)) == bytes(state_sync.state_digest(variables).numpy())


def test_digest_covers_variables_and_python_state():
    d = st.digest(b"ab", b'{"step":1}')
    assert d != st.digest(b"ab", b'{"step":2}') and d != st.digest(b"ac", b'{"step":1}')
    assert d != st.digest(b"a", b'b{"step":1}')  # the boundary between the parts counts
    assert d != st.digest(b"", b'ab{"step":1}')  # no variables hashed is not the same


def test_signature_names_shape_and_dtype_of_every_variable_in_order():
    sig = model_signature([tf.Variable(tf.zeros([2, 3]), name="kernel"), tf.Variable(0, dtype=tf.int64, name="it")])
    assert sig.splitlines() == ["kernel:0 (2, 3) float32", "it:0 () int64"]
    with pytest.raises(TypeError, match=r"variables\[0\] 's:0' has dtype string"):
        model_signature([tf.Variable("x", name="s")])


def test_python_state_holds_values_and_objects_with_state_dict():
    class Sampler:
        def __init__(self):
            self.offset = 0

        def state_dict(self):
            return {"offset": self.offset}

        def load_state_dict(self, d):
            self.offset = d["offset"]

    sampler = Sampler()
    state = elastic.ElasticState([tf.Variable(1.0)], sampler=sampler, lr=0.1)
    state.commit()
    state.epoch += 1
    sampler.offset = 12
    assert state.python_state() == {"step": 1, "epoch": 1, "sampler": {"offset": 12}, "lr": 0.1}
    other = elastic.ElasticState([tf.Variable(1.0)], sampler=Sampler(), lr=0.5)
    other.load_python_state(state.python_state())
    assert (other.step, other.epoch, other.sampler.offset, other.lr) == (1, 1, 12, 0.1)
    with pytest.raises(AttributeError, match="no value 'missing'"):
        _ = state.missing
    with pytest.raises(ValueError, match="'commit' cannot be the name of a value"):
        elastic.ElasticState([], commit=1)
    with pytest.raises(ValueError, match="check_every must be an int >= 1, got 0"):
        elastic.ElasticState([], check_every=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0,), {}, ValueError, "new_size must be >= 1, got 0"),
        ((-3,), {}, ValueError, "new_size must be >= 1, got -3"),
        ((2.5,), {}, TypeError, "new_size must be an int >= 1, got float 2.5"),
        ((True,), {}, TypeError, "got the bool True"),
        ((2,), {"workers": ["h:1"]}, ValueError, "pass new_size .* or workers .*, not both"),
        ((), {"workers": ["h:1", "h:2", "h:1"]}, ValueError, r"workers\[2\] 'h:1' appears more than once"),
        ((), {"workers": []}, ValueError, "at least one worker"),
        ((), {"workers": "h:1"}, TypeError, "workers must be a list"),
        ((), {"workers": [("h", 1)]}, TypeError, r"workers\[0\] must be a 'host:port' string"),
        ((2,), {"wait": 1}, TypeError, "wait must be a bool"),
    ],
)
def test_resize_refuses_bad_arguments_before_anything_happens(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        elastic.resize(*args, **kwargs)


def test_resize_outside_an_elastic_job_says_how_to_start_one(monkeypatch):
    monkeypatch.delenv("KUNGFU_CONFIG_SERVER", raising=False)
    with pytest.raises(NotElasticError, match="kungfu-run --elastic"):
        elastic.resize(1)


def test_a_peer_loss_is_recognised_eagerly_and_inside_a_tf_function():
    from kungfu_tf.elastic.runner import error_summary, is_peer_loss

    eager = tf.errors.UnavailableError(None, None, "{{function_node __wrapped__KungfuAllGather_device_/job:localhost/"
                                       "replica:0/task:0/device:CPU:0}} all_gather 'k': peer lost [Op:KungfuAllGather] name: ")
    traced = tf.errors.InternalError(None, None, "Graph execution error:\n\nDetected at node KungfuGroupAllReduce defined at"
                                     " (most recent call last):\n  File \"x.py\", line 1, in <module>\n\nall_reduce 'g': lost"
                                     " connection from rank 0\n\t [[{{node KungfuGroupAllReduce}}]]\nExecuting non-communication"
                                     " op <KungfuGroupAllReduce> originally returned UnavailableError, and was replaced by"
                                     " InternalError to avoid invoking TF network error handling logic.")
    in_py_function = tf.errors.UnknownError(None, None, "Graph execution error:\n\nDetected at node kungfu_resize"
                                            " defined at (most recent call last):\n\nUnavailableError: {{function_node"
                                            " __wrapped__KungfuAllGather_device_/job:localhost/replica:0/task:0/device:CPU:0}}"
                                            " all_gather 's': handshake failed [Op:KungfuAllGather] name: \nTraceback"
                                            " (most recent call last):\n\n\t [[{{node kungfu_resize}}]]")
    other = tf.errors.InternalError(None, None, "something else broke")
    assert is_peer_loss(eager) and is_peer_loss(traced) and is_peer_loss(in_py_function) and not is_peer_loss(other)
    assert error_summary(in_py_function) == "all_gather 's': handshake failed"
    assert not is_peer_loss(tf.errors.DeadlineExceededError(None, None, "a slow peer is not a lost one"))
    assert error_summary(eager) == "all_gather 'k': peer lost"
    assert error_summary(traced) == "all_reduce 'g': lost connection from rank 0"


class FakeMembership:
    """What elastic.runner.recover reads from the membership module, scripted."""

    def __init__(self, monkeypatch, *, lost, committed, min_size=1, alive=(), finished=()):
        from kungfu_tf.proto import config_pb2
        from kungfu_tf.run.control.config_server import make_cluster
        from kungfu_tf.run.control.peer_string import parse_peer_string

        self.peers = ("h:1", "h:2", "h:3")
        self.committed = committed  # version -> peers, what the service commits once asked
        self.reports, self.restarts, self.applied = [], [], []
        em = __import__("kungfu_tf.ops.elastic_membership", fromlist=["x"])

        def state(version, peers):
            s = config_pb2.JobState(min_size=min_size)
            s.cluster.CopyFrom(make_cluster(version, [parse_peer_string(p) for p in peers]))
            s.finished.extend(parse_peer_string(p) for p in finished)
            return s

        def report_lost(_, version, peers, reason):
            self.reports.append((version, list(peers)))
            return state(3, self.peers)

        def wait_for(_, predicate, timeout):
            newest = state(4, self.committed[4]) if 4 in self.committed else state(3, self.peers)
            return newest if predicate(newest) else None

        self.state = state
        client = type("Client", (), {"report_lost": report_lost, "get_job_state": lambda _: state(3, self.peers)})()
        monkeypatch.setattr(em, "watcher", lambda: type("Watcher", (), {"wait_for": wait_for})())
        monkeypatch.setattr(em, "current", lambda: (3, self.peers))
        monkeypatch.setattr(em, "self_peer", lambda: "h:1")
        monkeypatch.setattr(em, "job_state", lambda: state(3, self.peers))
        monkeypatch.setattr(em, "lost_peers", lambda: list(lost))
        monkeypatch.setattr(em, "config_client", lambda: client)
        monkeypatch.setattr(em, "restart_version", lambda v, p: self.restarts.append((v, tuple(p))))
        monkeypatch.setattr(
            em, "wait_newer_than", lambda v, timeout: state(4, self.committed[4]) if 4 in self.committed else None
        )
        monkeypatch.setattr(em, "cluster_at", lambda v: tuple(self.committed[v]))
        monkeypatch.setattr(em, "apply_version", lambda v, p: self.applied.append((v, tuple(p))) or "change")
        monkeypatch.setattr(em, "timeout_seconds", lambda: 0.1)
        from kungfu_tf.elastic import recovery

        monkeypatch.setattr(recovery, "accepts_connections", lambda peer: peer in alive)


def test_recovery_reports_the_lost_peer_and_applies_the_next_version(monkeypatch):
    from kungfu_tf.elastic.runner import recover

    fake = FakeMembership(monkeypatch, lost=["h:2"], committed={4: ("h:1", "h:3")})
    assert recover(elastic.ElasticState([]), tf.errors.UnavailableError(None, None, "peer h:2 lost")) == "change"
    assert fake.reports == [(3, ["h:2"])] and fake.applied == [(4, ("h:1", "h:3"))] and not fake.restarts


def test_recovery_fails_clearly_below_the_minimum_size(monkeypatch):
    from kungfu_tf.elastic.runner import recover

    fake = FakeMembership(monkeypatch, lost=["h:2", "h:3"], committed={4: ("h:1",)}, min_size=2)
    with pytest.raises(elastic.ElasticError, match=r"fell below the job's minimum size: version 4 has 1 worker\(s\) \(h:1\), --min-np is 2"):
        recover(elastic.ElasticState([]), tf.errors.UnavailableError(None, None, "lost"))
    assert not fake.applied


def test_recovery_fails_clearly_when_nothing_is_committed(monkeypatch):
    from kungfu_tf.elastic import recovery, runner

    monkeypatch.setattr(recovery, "RESTART_GRACE_SECONDS", 0.0)
    fake = FakeMembership(monkeypatch, lost=[], committed={})
    with pytest.raises(elastic.ElasticError, match="no new cluster version was committed within 0 s"):
        runner.recover(elastic.ElasticState([]), tf.errors.UnavailableError(None, None, "broken pipe"))
    assert fake.restarts == [(3, ("h:1", "h:2", "h:3"))]  # nobody lost: it tried to restart the version first


def test_recovery_does_not_report_a_live_peer_and_restarts_the_version_instead(monkeypatch):
    from kungfu_tf.elastic import recovery, runner

    monkeypatch.setattr(recovery, "RESTART_GRACE_SECONDS", 0.0)
    # h:2 broke a connection (a handshake, say) but still listens: not a crash.
    fake = FakeMembership(monkeypatch, lost=["h:2"], committed={}, alive=("h:2",))
    with pytest.raises(elastic.ElasticError, match="no new cluster version"):
        runner.recover(elastic.ElasticState([]), tf.errors.UnavailableError(None, None, "handshake: broken pipe"))
    assert fake.reports == [] and fake.restarts == [(3, ("h:1", "h:2", "h:3"))]


def test_recovery_into_a_version_that_only_admitted_joiners_restarts_it_so_that_the_others_stop(monkeypatch):
    """The --admit-window 0 hang: versions 4 (a joiner) and 5 (another) were committed back to back; this
    worker's collective of version 3 broke on a live peer (a handshake cut by the peer's swap) while the
    other members still wait in it. Applying 4 alone would leave them waiting for this worker until the
    timeout (their watchers see only joiners admitted): it must restart the newest version (6 = 5's members),
    which stops every member still in 3, and then apply 4 like them."""
    from kungfu_tf.elastic import runner
    from kungfu_tf.ops import elastic_membership as em

    v4, v5 = ("h:1", "h:2", "h:3", "h:4"), ("h:1", "h:2", "h:3", "h:4", "h:5")
    fake = FakeMembership(monkeypatch, lost=["h:2"], committed={4: v4, 5: v5}, alive=("h:2",))
    newest = [5]

    def restart(version, peers):
        fake.restarts.append((version, tuple(peers)))
        if version == newest[0]:  # the compare-and-swap: only on top of the newest
            fake.committed[version + 1] = tuple(peers)
            newest[0] = version + 1

    client = em.config_client()
    client.get_job_state = lambda: fake.state(newest[0], fake.committed.get(newest[0], fake.peers))
    monkeypatch.setattr(em, "restart_version", restart)
    monkeypatch.setattr(em, "committed_peers", lambda v, client=None: fake.committed[v], raising=False)
    error = tf.errors.UnavailableError(None, None, "handshake with rank 1 (h:2) failed: sending client hello: Broken pipe")
    assert runner.recover(elastic.ElasticState([]), error) == "change"
    assert fake.reports == [] and fake.restarts == [(5, v5)] and fake.applied == [(4, v4)]
    # What the members still in version 3 see now: a restart after their version stops them.
    stop = em.stop_reason(3, fake.peers, fake.state(6, v5), lambda v: fake.committed[v])
    assert stop == "cluster version 5 was restarted as version 6"


def test_only_a_crash_or_a_restart_after_its_version_stops_a_member(monkeypatch):
    """stop_reason, as every watcher applies it to the newest committed version (peers by version below)."""
    from kungfu_tf.ops import elastic_membership as em
    from kungfu_tf.proto import config_pb2
    from kungfu_tf.run.control.config_server import make_cluster
    from kungfu_tf.run.control.peer_string import parse_peer_string

    committed = {3: ("a", "b"), 4: ("a", "b", "c"), 5: ("a", "b", "c", "d"), 6: ("a", "b", "c", "d"), 7: ("a", "c")}

    def newest(version):
        s = config_pb2.JobState()
        s.cluster.CopyFrom(make_cluster(version, [parse_peer_string(p) for p in committed[version]]))
        return s

    committed = {v: tuple(f"{p}:1" for p in peers) for v, peers in committed.items()}
    asked = []

    def peers_at(v):
        asked.append(v)
        return committed[v]

    assert em.stop_reason(3, committed[3], newest(4), peers_at) is None  # a joiner: applied at the next check
    assert em.stop_reason(3, committed[3], newest(5), peers_at) is None  # two joiners back to back
    assert em.stop_reason(3, committed[3], newest(6), peers_at) == "cluster version 5 was restarted as version 6"
    assert em.stop_reason(5, committed[5], newest(6), peers_at) == "cluster version 5 was restarted as version 6"
    assert em.stop_reason(3, committed[3], newest(7), peers_at) == (
        "cluster version 7 was committed without b:1, members of version 3 that this worker uses"
    )
    assert set(asked) <= {4, 5}  # only the versions in between are looked up


def test_the_watcher_stops_a_member_when_a_later_version_was_restarted(monkeypatch):
    """A member still in version 3 while 4 (a joiner) and 5 (a restart of 4) were committed is interrupted."""
    from kungfu_tf.ops import elastic_membership as em
    from kungfu_tf.proto import config_pb2
    from kungfu_tf.run.control.config_server import make_cluster
    from kungfu_tf.run.control.peer_string import parse_peer_string

    def cluster(version, peers):
        return make_cluster(version, [parse_peer_string(p) for p in peers])

    v3, v4 = ("h:1", "h:2"), ("h:1", "h:2", "h:3")
    interrupts, asked = [], []
    monkeypatch.setattr(em, "_membership", lambda: type("M", (), {"interrupt": staticmethod(interrupts.append)}))
    monkeypatch.setattr(em, "_committed_cache", {}, raising=False)
    for name, value in (("version", 3), ("peers", v3), ("self_peer", "h:1"), ("own_commit", 0)):
        monkeypatch.setattr(em._state, name, value)
    watcher = object.__new__(em._Watcher)
    watcher._interrupted_version = None
    watcher._client = type("Client", (), {"get_cluster_at": lambda _, v: asked.append(v) or cluster(v, v4)})()
    state = config_pb2.JobState()
    state.cluster.CopyFrom(cluster(4, v4))
    watcher.recheck(state)
    assert interrupts == []  # a joiner admitted: no step is stopped
    state.cluster.CopyFrom(cluster(5, v4))
    watcher.recheck(state)
    assert interrupts == ["cluster version 4 was restarted as version 5"] and asked == [4]


def test_recovery_ends_at_once_when_a_member_finished(monkeypatch):
    """A finished member's goodbye is not a crash: no report, no restart, no waiting; the job is ending."""
    from kungfu_tf.elastic import runner

    fake = FakeMembership(monkeypatch, lost=[], committed={}, finished=("h:3",))
    with pytest.raises(elastic.JobEndedError, match="the job is ending: h:3 finished training .*left the cluster"):
        runner.recover(elastic.ElasticState([]), tf.errors.UnavailableError(None, None, "rank 2 left the cluster"))
    assert fake.reports == [] and fake.restarts == [] and fake.applied == []


def test_a_peer_that_listens_accepts_connections_and_a_closed_port_does_not():
    import socket

    from kungfu_tf.elastic.runner import accepts_connections

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert accepts_connections(f"127.0.0.1:{port}", duration=0.2)
    assert not accepts_connections(f"127.0.0.1:{port}", duration=0.2)


def test_a_restart_commits_the_same_members_and_keeps_a_growth_under_way(monkeypatch):
    import secrets

    from kungfu_tf.ops import elastic_membership as em
    from kungfu_tf.run.control.config_server import ConfigServer, make_cluster
    from kungfu_tf.run.control.peer_string import parse_peer_string

    secret = secrets.token_hex(32)
    cluster = make_cluster(1, [parse_peer_string("h:1"), parse_peer_string("h:2")])
    with ConfigServer(secret=secret, job_id="restart", cluster=cluster, elastic=True, max_size=3) as server:
        for name, value in (("KUNGFU_CONFIG_SERVER", server.address), ("KUNGFU_JOB_SECRET", secret), ("KUNGFU_JOB_ID", "restart")):
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(em._state, "client", None)
        try:
            em.config_client().request_size(3)  # a joiner is on its way
            em.restart_version(1, ["h:1", "h:2"])
            state = server.job_state()
            assert (state.cluster.version, em.peers_of(state.cluster), state.target_size) == (2, ("h:1", "h:2"), 3)
            em.restart_version(1, ["h:1", "h:2"])  # another member's restart came first: nothing more
            assert server.job_state().cluster.version == 2
        finally:
            em.config_client().close()
            em._state.client = None


def test_a_sync_without_receivers_hashes_the_variables_only_when_asked(monkeypatch):
    """One worker is its own source: nothing is transferred, so the variables are hashed only with verify_all_syncs."""
    import tensorflow as tf

    from kungfu_tf.elastic import state as state_module

    hashed = []
    real = state_module.state_sync.state_digest

    def counting(variables):
        hashed.append(len(variables))
        return real(variables)

    monkeypatch.setattr(state_module.state_sync, "state_digest", counting)
    variables = [tf.Variable([1.0, 2.0]), tf.Variable(3, dtype=tf.int64)]
    state_module.ElasticState(variables).sync()
    assert hashed == []
    state_module.ElasticState(variables, verify_all_syncs=True).sync()
    assert hashed == [2]


@pytest.mark.parametrize("me", ["h:1", "h:2"], ids=["rank 0 asks the service", "another member"])
def test_a_refused_cancel_of_a_pending_growth_raises_the_same_error_on_every_member(monkeypatch, me):
    """``resize(size)`` at the current size cancels a pending growth: only rank 0 calls the service. Before, a
    refusal raised a bare grpc error on rank 0 alone, while the others returned and went on into a
    collective rank 0 never joined (they waited for the timeout). Now every member learns the outcome from
    one all-reduce (here one process: the all-reduce of rank 0's refusal is passed in as the other
    members would receive it) and raises the same ResizeError."""
    import contextlib
    import importlib

    import grpc

    resize_module = importlib.import_module("kungfu_tf.ops.resize")  # kungfu_tf.ops.resize is also the function
    from kungfu_tf.proto import config_pb2
    from kungfu_tf.run.control.config_server import make_cluster
    from kungfu_tf.run.control.peer_string import parse_peer_string

    em = __import__("kungfu_tf.ops.elastic_membership", fromlist=["x"])
    peers = ("h:1", "h:2")

    class Refused(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self):
            return "the job is ending"

    def request_size(n):
        raise Refused()

    state = config_pb2.JobState(target_size=3, min_size=1, max_size=4)
    state.cluster.CopyFrom(make_cluster(5, [parse_peer_string(p) for p in peers]))
    monkeypatch.setattr(em, "watcher", lambda: None)
    monkeypatch.setattr(em, "current", lambda: (5, peers))
    monkeypatch.setattr(em, "self_peer", lambda: me)
    monkeypatch.setattr(em, "job_state", lambda: state)
    monkeypatch.setattr(em, "resizing", lambda v: contextlib.nullcontext())
    monkeypatch.setattr(em, "config_client", lambda: type("C", (), {"request_size": staticmethod(request_size)})())
    monkeypatch.setattr(resize_module, "_agree", lambda request, version: None)
    outcomes = []
    # What the all-reduce(min) of the outcomes gives every member: rank 0's refusal.
    monkeypatch.setattr(resize_module, "_confirm", lambda code, v, what: outcomes.append(code) or resize_module._REFUSED)
    with pytest.raises(resize_module.ResizeError, match="refused to set the target back to 2 workers .*the job is ending|refused to set the target back to 2 workers .*see the log of h:1"):
        resize_module._resize_now(2, None, False, 1.0)
    assert outcomes == [resize_module._REFUSED if me == "h:1" else resize_module._COMMITTED]
