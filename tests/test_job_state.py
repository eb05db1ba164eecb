"""Unit tests for kungfu_tf.run.control.job_state (the config service's state machine, no gRPC)
and kungfu_tf.run.control.peer_string."""

import math
import threading
import time

import pytest
from waiting import HANG_BOUND_SECONDS, NEVER_SECONDS, returns

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control import job_state
from kungfu_tf.run.control.job_state import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    JobStateMachine,
    NotFoundError,
    OutOfRangeError,
    job_finished,
    signature_difference,
)
from kungfu_tf.run.control.peer_string import (
    cluster_peers,
    parse_peer_string,
    peer_string,
)

Joiner = config_pb2.Joiner
SIG = "dense/kernel (784, 10) float32\ndense/bias (10,) float32\nstep () int64"
OTHER_SIG = "dense/kernel (784, 20) float32\ndense/bias (10,) float32\nstep () int64"


def p(text: str) -> config_pb2.PeerID:
    return parse_peer_string(text)


def cluster(version: int, *peers: str) -> config_pb2.Cluster:
    return config_pb2.Cluster(version=version, workers=[p(x) for x in peers])


def elastic(*peers: str, version: int = 1, **kwargs) -> JobStateMachine:
    return JobStateMachine(cluster(version, *peers), elastic=True, **kwargs)


def joiners(state) -> dict[str, int]:
    return {peer_string(j.peer): j.state for j in state.joiners}


# ---------------------------------------------------------------- peer strings


@pytest.mark.parametrize(
    "text, host, port",
    [("10.0.0.1:10000", "10.0.0.1", 10000), ("node-3:65535", "node-3", 65535), ("[::1]:1", "::1", 1),
     ("[fe80::1%eth0]:7", "fe80::1%eth0", 7)],
)
def test_peer_string_round_trip(text, host, port):
    peer = parse_peer_string(text)
    assert (peer.host, peer.port) == (host, port)
    assert peer_string(peer) == text


@pytest.mark.parametrize("text", ["h", "h:", ":1", "h:0", "h:65536", "h:x", "h:-1", "::1:5", "[h]:1", "[::1]", "h:1 "])
def test_parse_peer_string_rejects(text):
    with pytest.raises(ValueError) as err:
        parse_peer_string(text)
    assert repr(text) in str(err.value) and "host:port" in str(err.value)


def test_parse_peer_string_rejects_non_strings():
    with pytest.raises(TypeError, match="'host:port' string"):
        parse_peer_string(("h", 1))


def test_cluster_peers_in_rank_order():
    assert cluster_peers(cluster(3, "b:2", "a:1", "[::1]:3")) == ["b:2", "a:1", "[::1]:3"]


# ------------------------------------------------------------------ signatures


def test_signature_difference_names_the_first_differing_line():
    assert signature_difference(SIG, SIG) is None
    assert signature_difference(SIG, SIG + "\n") is None  # compared by lines
    assert signature_difference(SIG, OTHER_SIG) == (
        "line 1: the job has 'dense/kernel (784, 10) float32', the joiner has 'dense/kernel (784, 20) float32'"
    )
    shorter = signature_difference(SIG, "\n".join(SIG.splitlines()[:2]))
    assert shorter.startswith("line 3: the job has 'step () int64', the joiner has no such line")
    longer = signature_difference(SIG, SIG + "\nextra (1,) float32")
    assert longer.startswith("line 4: the joiner has 'extra (1,) float32', the job has no such line")


# -------------------------------------------------------------- construction


def test_initial_state():
    jobs = elastic("h:1", "h:2", version=1, min_size=2, max_size=4)
    state = jobs.job_state()
    assert state.state_version == 1  # so wait(after_state_version=0) answers at once
    assert (state.target_size, state.min_size, state.max_size) == (2, 2, 4)
    assert cluster_peers(state.cluster) == ["h:1", "h:2"] and state.cluster.version == 1
    assert state.signature == "" and list(state.joiners) == []
    assert jobs.cluster_at(1) == state.cluster
    assert jobs.commit_reason(1) == "initial cluster"
    with pytest.raises(NotFoundError, match="version 0 was never committed"):
        jobs.cluster_at(0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_size": 0}, "min_size must be at least 1, got 0"),
        ({"min_size": 3, "max_size": 2}, r"max_size \(2\) must be 0 \(no limit\) or >= min_size \(3\)"),
        ({"min_size": 3}, r"initial cluster has 2 workers, outside \[min_size=3"),
        ({"max_size": 1}, r"initial cluster has 2 workers, outside \[min_size=1, max_size=1\]"),
        ({"max_size": -1}, "max_size must be an integer in 0..2\\*\\*32-1, got -1"),
        ({"min_size": 1.5}, "min_size must be an integer"),
    ],
)
def test_bad_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        elastic("h:1", "h:2", **kwargs)


def test_bad_initial_cluster():
    with pytest.raises(ValueError, match="initial cluster: workers\\[1\\] h:1 appears more than once"):
        JobStateMachine(cluster(1, "h:1", "h:1"))


# ---------------------------------------------------------------- put_cluster


def test_put_cluster_is_compare_and_swap_and_sets_target_size():
    jobs = elastic("h:1", "h:2", "h:3")
    with pytest.raises(FailedPreconditionError, match="at version 1, so the new cluster must have version 2, got 3"):
        jobs.put_cluster(cluster(3, "h:1"))
    assert jobs.cluster().version == 1
    stored = jobs.put_cluster(cluster(2, "h:3", "h:1"))
    assert cluster_peers(stored) == ["h:3", "h:1"]
    state = jobs.job_state()
    assert state.target_size == 2 and state.state_version == 2
    assert jobs.cluster_at(1) == cluster(1, "h:1", "h:2", "h:3")  # history kept
    assert jobs.commit_reason(2) == "put_cluster"


def test_put_cluster_size_outside_min_max_is_out_of_range():
    jobs = elastic("h:1", "h:2", "h:3", min_size=2, max_size=3)
    with pytest.raises(OutOfRangeError, match=r"1 workers, outside \[min_size=2, max_size=3\]"):
        jobs.put_cluster(cluster(2, "h:1"))
    with pytest.raises(OutOfRangeError, match="4 workers"):
        jobs.put_cluster(cluster(2, "h:1", "h:2", "h:3", "h:4"))
    assert jobs.job_state().state_version == 1  # nothing changed
    # Without --elastic there are no bounds (and no target size to follow).
    plain = JobStateMachine(cluster(1, "h:1"))
    plain.put_cluster(cluster(2))
    assert plain.job_state().target_size == 1


@pytest.mark.parametrize("peers, message", [(["h:1", "h:1"], "appears more than once")])
def test_put_cluster_malformed(peers, message):
    with pytest.raises(InvalidArgumentError, match=message):
        elastic("h:1").put_cluster(cluster(2, *peers))
    with pytest.raises(InvalidArgumentError, match="workers\\[0\\] has an empty host"):
        elastic("h:1").put_cluster(config_pb2.Cluster(version=2, workers=[config_pb2.PeerID(port=1)]))
    with pytest.raises(InvalidArgumentError, match="invalid port 70000"):
        elastic("h:1").put_cluster(config_pb2.Cluster(version=2, workers=[config_pb2.PeerID(host="h", port=70000)]))


def test_put_cluster_that_takes_a_joiner_in_forgets_it():
    jobs = elastic("h:1")
    jobs.add_joiner(p("h:2"))
    jobs.put_cluster(cluster(2, "h:1", "h:2"))
    assert list(jobs.job_state().joiners) == []


# --------------------------------------------------------------- request_size


def test_request_size_bounds_and_versions():
    jobs = elastic("h:1", "h:2", min_size=2, max_size=4)
    for bad in (0, 1, 5):
        with pytest.raises(OutOfRangeError, match=rf"requested size {bad} is outside \[min_size=2, max_size=4\]"):
            jobs.request_size(bad)
    assert jobs.request_size(2).state_version == 1  # unchanged: no new state version
    state = jobs.request_size(4)
    assert state.target_size == 4 and state.state_version == 2
    assert state.cluster.version == 1  # growing waits for joiners
    unbounded = elastic("h:1")
    with pytest.raises(OutOfRangeError, match=r"outside \[min_size=1, no max_size\]"):
        unbounded.request_size(0)
    assert unbounded.request_size(1000).target_size == 1000


def test_elastic_requests_need_an_elastic_job():
    jobs = JobStateMachine(cluster(1, "h:1"))
    calls = {
        "RequestSize": lambda: jobs.request_size(2),
        "ReportLost": lambda: jobs.report_lost(1, [p("h:1")]),
        "AddJoiner": lambda: jobs.add_joiner(p("h:2")),
        "JoinerReady": lambda: jobs.joiner_ready(p("h:2"), SIG),
        "SetSignature": lambda: jobs.set_signature(SIG),
        "RemoveJoiner": lambda: jobs.remove_joiner(p("h:2")),
        "ReportFinished": lambda: jobs.report_finished(p("h:1")),
    }
    for method, call in calls.items():
        with pytest.raises(FailedPreconditionError, match=f"{method} needs an elastic job"):
            call()
    # Reads work in every job.
    assert jobs.job_state().cluster.version == 1 and jobs.cluster_at(1).version == 1


# ---------------------------------------------------------------- admission


def test_joiners_are_admitted_in_ready_order_while_below_target():
    jobs = elastic("h:1", "h:2", max_size=8)
    jobs.set_signature(SIG)
    for peer in ("h:3", "h:4", "h:5"):
        assert joiners(jobs.add_joiner(p(peer)))[peer] == Joiner.STARTING
    jobs.request_size(4)
    # h:5 is ready first, then h:3; h:4 never reports.
    state = jobs.joiner_ready(p("h:5"), SIG)
    assert cluster_peers(state.cluster) == ["h:1", "h:2", "h:5"] and state.cluster.version == 2
    state = jobs.joiner_ready(p("h:3"), SIG)
    assert cluster_peers(state.cluster) == ["h:1", "h:2", "h:5", "h:3"] and state.cluster.version == 3
    assert joiners(state) == {"h:4": Joiner.STARTING}
    assert jobs.commit_reason(2) == "admitted h:5"
    # At the target: a further READY joiner waits.
    state = jobs.joiner_ready(p("h:4"), SIG)
    assert state.cluster.version == 3 and joiners(state) == {"h:4": Joiner.READY}
    # Raising the target admits it.
    state = jobs.request_size(5)
    assert cluster_peers(state.cluster)[-1] == "h:4" and state.cluster.version == 4 and not state.joiners


def test_ready_joiners_wait_for_the_signature_then_are_admitted_together():
    jobs = elastic("h:1", max_size=8)
    jobs.request_size(4)
    for peer in ("h:2", "h:3", "h:4"):
        jobs.add_joiner(p(peer))
    jobs.joiner_ready(p("h:4"), SIG)
    jobs.joiner_ready(p("h:2"), SIG)
    jobs.joiner_ready(p("h:5"), SIG)  # not announced by add_joiner: accepted
    jobs.joiner_ready(p("h:3"), SIG)
    state = jobs.job_state()
    assert state.cluster.version == 1 and set(joiners(state).values()) == {Joiner.READY}
    state = jobs.set_signature(SIG)
    # One version for the first three in ready order (not in the order they were added).
    assert state.cluster.version == 2 and cluster_peers(state.cluster) == ["h:1", "h:4", "h:2", "h:5"]
    assert jobs.commit_reason(2) == "admitted h:4, h:2, h:5"
    assert joiners(state) == {"h:3": Joiner.READY}


def test_joiner_with_another_model_is_rejected_with_the_first_difference():
    jobs = elastic("h:1", max_size=4)
    jobs.set_signature(SIG)
    jobs.request_size(2)
    jobs.add_joiner(p("h:2"))
    state = jobs.joiner_ready(p("h:2"), OTHER_SIG)
    (joiner,) = state.joiners
    assert joiner.state == Joiner.REJECTED and joiner.signature == OTHER_SIG
    assert joiner.reason == (
        "joiner h:2 has a different model: line 1: the job has 'dense/kernel (784, 10) float32', "
        "the joiner has 'dense/kernel (784, 20) float32'"
    )
    assert state.cluster.version == 1  # never admitted
    with pytest.raises(FailedPreconditionError, match="joiner h:2 is already REJECTED: joiner h:2 has a different"):
        jobs.joiner_ready(p("h:2"), SIG)
    # Its launcher removes it; a new process at that address may join.
    jobs.remove_joiner(p("h:2"))
    assert jobs.joiner_ready(p("h:2"), SIG).cluster.version == 2


def test_ready_joiners_are_judged_when_the_signature_is_set():
    jobs = elastic("h:1", max_size=4)
    jobs.request_size(3)
    jobs.joiner_ready(p("h:2"), OTHER_SIG)
    jobs.joiner_ready(p("h:3"), SIG)
    state = jobs.set_signature(SIG)
    assert cluster_peers(state.cluster) == ["h:1", "h:3"]
    assert joiners(state) == {"h:2": Joiner.REJECTED}
    assert "line 1" in state.joiners[0].reason


def test_set_signature():
    jobs = elastic("h:1")
    with pytest.raises(InvalidArgumentError, match="empty model signature"):
        jobs.set_signature(" \n")
    assert jobs.set_signature(SIG).state_version == 2
    assert jobs.set_signature(SIG).state_version == 2  # the same again: no change
    with pytest.raises(FailedPreconditionError) as err:
        jobs.set_signature(OTHER_SIG)
    assert str(err.value) == (
        "the model signature differs from the job's at line 1: the job has 'dense/kernel (784, 10) float32', "
        "this member has 'dense/kernel (784, 20) float32'"
    )
    assert jobs.job_state().signature == SIG


def test_joiner_bookkeeping_errors():
    jobs = elastic("h:1", max_size=4)
    jobs.set_signature(SIG)
    version = jobs.add_joiner(p("h:2")).state_version
    assert jobs.add_joiner(p("h:2")).state_version == version  # repeated: no-op
    with pytest.raises(AlreadyExistsError, match="h:1 is already a member of cluster version 1"):
        jobs.add_joiner(p("h:1"))
    jobs.joiner_ready(p("h:2"), SIG)  # target 1: stays READY
    with pytest.raises(AlreadyExistsError, match="joiner h:2 is already READY; RemoveJoiner it"):
        jobs.add_joiner(p("h:2"))
    assert jobs.joiner_ready(p("h:2"), SIG).state_version == jobs.job_state().state_version  # retried: no-op
    with pytest.raises(FailedPreconditionError, match="joiner h:2 is already READY"):
        jobs.joiner_ready(p("h:2"), OTHER_SIG)
    with pytest.raises(InvalidArgumentError, match="empty model signature"):
        jobs.joiner_ready(p("h:3"), "")
    with pytest.raises(InvalidArgumentError, match="peer has an empty host"):
        jobs.add_joiner(config_pb2.PeerID(port=1))
    with pytest.raises(InvalidArgumentError, match="invalid port 0"):
        jobs.joiner_ready(config_pb2.PeerID(host="h"), SIG)
    with pytest.raises(NotFoundError, match="h:9 is not a joiner$"):
        jobs.remove_joiner(p("h:9"))
    with pytest.raises(NotFoundError, match="h:1 is not a joiner; it is a member of cluster version 1 .use ReportLost"):
        jobs.remove_joiner(p("h:1"))
    state = jobs.remove_joiner(p("h:2"))
    assert list(state.joiners) == []
    # A withdrawn joiner that reports READY late is not brought back ...
    jobs.add_joiner(p("h:4"))
    jobs.remove_joiner(p("h:4"))  # e.g. still STARTING after --join-timeout
    with pytest.raises(FailedPreconditionError, match="joiner h:4 was withdrawn .RemoveJoiner. before it was ready"):
        jobs.joiner_ready(p("h:4"), SIG)
    assert list(jobs.job_state().joiners) == []
    # ... unless a launcher announces a joiner at that address again.
    jobs.add_joiner(p("h:4"))
    assert joiners(jobs.joiner_ready(p("h:4"), SIG)) == {"h:4": Joiner.READY}
    # Withdrawn while READY (a surplus one): its retried JoinerReady is refused too.
    jobs.remove_joiner(p("h:4"))
    with pytest.raises(FailedPreconditionError, match="joiner h:4 was withdrawn"):
        jobs.joiner_ready(p("h:4"), SIG)
    # A member's retried JoinerReady gets the state (it was admitted already).
    assert jobs.joiner_ready(p("h:1"), SIG).cluster.version == 1


# ----------------------------------------------------------------- report_lost


def test_first_report_commits_later_ones_are_no_ops():
    jobs = elastic("h:1", "h:2", "h:3", "h:4", max_size=8)
    state = jobs.report_lost(1, [p("h:3")], "killed by SIGKILL")
    assert state.cluster.version == 2 and cluster_peers(state.cluster) == ["h:1", "h:2", "h:4"]
    assert state.target_size == 3  # crashed workers are not replaced
    assert jobs.commit_reason(2) == "lost h:3: killed by SIGKILL"
    # Another survivor's report about version 1 (same or other lost peers): the current state.
    for peers in ([p("h:3")], [p("h:3"), p("h:2")]):
        again = jobs.report_lost(1, peers, "connection reset")
        assert again == state
    # A report about version 2 commits version 3.
    state = jobs.report_lost(2, [p("h:4"), p("h:1")])
    assert cluster_peers(state.cluster) == ["h:2"] and state.cluster.version == 3
    assert jobs.commit_reason(3) == "lost h:1, h:4"  # in rank order
    assert state.target_size == 1


def test_report_lost_errors():
    jobs = elastic("h:1", "h:2")
    with pytest.raises(InvalidArgumentError, match="no peers named as lost"):
        jobs.report_lost(1, [])
    with pytest.raises(InvalidArgumentError, match=r"h:9 is not a member of cluster version 1 \(h:1, h:2\)"):
        jobs.report_lost(1, [p("h:9")])
    with pytest.raises(InvalidArgumentError, match="reported version 7 was never committed .the cluster is at version 1"):
        jobs.report_lost(7, [p("h:1")])
    with pytest.raises(InvalidArgumentError, match="peers\\[1\\] has an empty host"):
        jobs.report_lost(1, [p("h:1"), config_pb2.PeerID(port=3)])
    assert jobs.job_state().state_version == 1


def test_report_lost_clamps_target_at_min_size():
    jobs = elastic("h:1", "h:2", "h:3", min_size=2)
    state = jobs.report_lost(1, [p("h:1"), p("h:2")])
    # The crash is committed even below min_size (the launcher fails the job);
    # target_size stays within [min_size, max_size].
    assert len(state.cluster.workers) == 1 and state.target_size == 2


def test_replace_crashed_keeps_target_and_admits_a_ready_replacement():
    jobs = elastic("h:1", "h:2", "h:3", replace_crashed=True)
    jobs.set_signature(SIG)
    jobs.joiner_ready(p("h:9"), SIG)  # a spare, READY, waiting for room
    state = jobs.report_lost(1, [p("h:2")], "exit code 1")
    assert state.target_size == 3
    # Version 2 without the lost worker, then version 3 with the replacement.
    assert cluster_peers(jobs.cluster_at(2)) == ["h:1", "h:3"]
    assert state.cluster.version == 3 and cluster_peers(state.cluster) == ["h:1", "h:3", "h:9"]


# ------------------------------------------------------------- finished members


def finished(state) -> list[str]:
    return [peer_string(w) for w in state.finished]


def test_finished_members_stay_members_until_every_one_finished():
    jobs = elastic("h:1", "h:2", "h:3")
    state = jobs.report_finished(p("h:2"))
    assert finished(state) == ["h:2"] and state.state_version == 2
    # The membership does not change: nothing is committed.
    assert state.cluster.version == 1 and cluster_peers(state.cluster) == ["h:1", "h:2", "h:3"]
    assert not job_finished(state)
    assert jobs.report_finished(p("h:2")).state_version == 2  # repeated: no-op
    jobs.report_finished(p("h:3"))
    state = jobs.report_finished(p("h:1"))
    assert finished(state) == ["h:2", "h:3", "h:1"]  # in the order reported
    assert job_finished(state) and job_finished(jobs.job_state())


def test_only_a_current_member_can_finish():
    jobs = elastic("h:1", "h:2", max_size=4)
    jobs.add_joiner(p("h:3"))
    for peer in ("h:3", "h:9"):  # a joiner, a stranger
        with pytest.raises(
            FailedPreconditionError,
            match=rf"{peer} is not a member of the current cluster version 1 \(h:1, h:2\); "
            "a worker that exits 0 after it was left out detached, it did not finish",
        ):
            jobs.report_finished(p(peer))
    # Left out by version 2 (a shrink): its exit 0 is a detach.
    jobs.put_cluster(cluster(2, "h:1"))
    with pytest.raises(FailedPreconditionError, match="h:2 is not a member of the current cluster version 2"):
        jobs.report_finished(p("h:2"))
    with pytest.raises(InvalidArgumentError, match="peer has an empty host"):
        jobs.report_finished(config_pb2.PeerID(port=1))
    assert finished(jobs.job_state()) == []


def test_a_finished_member_is_not_lost():
    jobs = elastic("h:1", "h:2", "h:3", "h:4", replace_crashed=True)
    jobs.report_finished(p("h:1"))
    before = jobs.job_state()
    # Its peers took its goodbye for a crash: ignored, nothing committed.
    assert jobs.report_lost(1, [p("h:1")], "connection reset") == before
    # Named beside a real crash: only the crashed one leaves.
    state = jobs.report_lost(1, [p("h:1"), p("h:3")], "connection reset")
    assert state.cluster.version == 2 and cluster_peers(state.cluster) == ["h:1", "h:2", "h:4"]
    assert jobs.commit_reason(2) == "lost h:3: connection reset"
    assert finished(state) == ["h:1"]  # still a finished member of version 2
    jobs.report_finished(p("h:2"))
    assert not job_finished(jobs.job_state())  # h:4 still runs
    assert job_finished(jobs.report_finished(p("h:4")))


def test_no_joiner_is_admitted_once_a_member_finished():
    jobs = elastic("h:1", "h:2", max_size=4)
    jobs.set_signature(SIG)
    jobs.request_size(3)
    jobs.report_finished(p("h:1"))
    state = jobs.joiner_ready(p("h:3"), SIG)
    # Room and the right model, but the job is ending: it stays READY.
    assert state.cluster.version == 1 and joiners(state) == {"h:3": Joiner.READY}
    assert jobs.request_size(4).cluster.version == 1


def test_finished_members_left_out_by_put_cluster_are_forgotten():
    jobs = elastic("h:1", "h:2", "h:3")
    jobs.report_finished(p("h:3"))
    jobs.report_finished(p("h:1"))
    jobs.put_cluster(cluster(2, "h:1", "h:2"))
    assert finished(jobs.job_state()) == ["h:1"]
    assert not job_finished(jobs.job_state())
    # h:3 is no member any more: the job is over without it.
    assert job_finished(jobs.report_finished(p("h:2")))


# ------------------------------------------------------------- state_version


def test_state_version_advances_once_per_change_only():
    jobs = elastic("h:1", max_size=4)
    steps = [
        lambda: jobs.set_signature(SIG),
        lambda: jobs.request_size(2),
        lambda: jobs.add_joiner(p("h:2")),
        lambda: jobs.joiner_ready(p("h:2"), SIG),  # READY and admitted: one change
        lambda: jobs.put_cluster(cluster(3, "h:2")),
        lambda: jobs.add_joiner(p("h:3")),
        lambda: jobs.remove_joiner(p("h:3")),
        lambda: jobs.report_lost(3, [p("h:2")]),
    ]
    for expected, step in enumerate(steps, start=2):
        step()
        assert jobs.job_state().state_version == expected
    no_ops = [
        lambda: jobs.set_signature(SIG),
        lambda: jobs.request_size(1),
        lambda: jobs.report_lost(3, [p("h:2")]),
        lambda: jobs.job_state(),
        lambda: jobs.cluster_at(2),
    ]
    for step in no_ops:
        step()
        assert jobs.job_state().state_version == len(steps) + 1


# ------------------------------------------------------------------ long poll


def test_wait_answers_at_once_when_already_newer(monkeypatch):
    monkeypatch.setattr(job_state, "MAX_WAIT_SECONDS", NEVER_SECONDS)
    jobs = elastic("h:1")
    # At once: with an hour's timeout, only an answer that never waited
    # returns within the hang bound (a clock bound raced the host's speed).
    assert returns(lambda: jobs.wait(0, NEVER_SECONDS)).state_version == 1


def test_wait_wakes_on_a_change_and_returns_at_the_timeout(monkeypatch):
    monkeypatch.setattr(job_state, "MAX_WAIT_SECONDS", NEVER_SECONDS)
    jobs = elastic("h:1", max_size=4)
    got = {}

    def poll():
        got["state"] = jobs.wait(1, NEVER_SECONDS)

    waiter = threading.Thread(target=poll, daemon=True)
    waiter.start()
    time.sleep(0.2)
    assert "state" not in got
    jobs.request_size(3)
    # Woken, not timed out: its timeout is an hour, so only the change can
    # end it within the hang bound.
    waiter.join(HANG_BOUND_SECONDS)
    assert not waiter.is_alive(), "the waiter was not woken by the change"
    assert got["state"].target_size == 3 and got["state"].state_version == 2

    # Nothing changes: it returns at its timeout (never before it; an
    # hour's cap means that only the timeout can end it in time).
    start = time.monotonic()
    state = returns(lambda: jobs.wait(2, 0.3))
    assert time.monotonic() - start >= 0.25 and state.state_version == 2


def test_wait_is_capped(monkeypatch):
    monkeypatch.setattr(job_state, "MAX_WAIT_SECONDS", 0.2)
    start = time.monotonic()
    elastic("h:1").wait(1, 3600)
    assert time.monotonic() - start < HANG_BOUND_SECONDS  # capped at 0.2 s, not 3600 s (a hang bound)


@pytest.mark.parametrize("timeout", [-1, math.nan, "1", True])
def test_wait_rejects_bad_timeouts(timeout):
    with pytest.raises(InvalidArgumentError, match="timeout must be a number of seconds >= 0"):
        elastic("h:1").wait(1, timeout)


def test_wait_after_a_future_state_version_is_an_error():
    with pytest.raises(InvalidArgumentError, match="after_state_version 5 is ahead of the job's state_version 1"):
        elastic("h:1").wait(5, 1)


def test_cancelled_and_released_waits_return_early(monkeypatch):
    # Waits of an hour: only the cancellation or the release can end them
    # within the hang bound (2 s joins against a 30 s wait raced the host).
    monkeypatch.setattr(job_state, "MAX_WAIT_SECONDS", NEVER_SECONDS)
    jobs = elastic("h:1")
    cancelled = threading.Event()
    results = []

    def poll(**kwargs):
        results.append(jobs.wait(1, NEVER_SECONDS, **kwargs))

    b_waits = threading.Event()

    def b_probe() -> bool:  # called in the wait loop, under the lock: b is waiting
        b_waits.set()
        return False

    a = threading.Thread(target=poll, kwargs={"cancelled": cancelled.is_set}, daemon=True)
    b = threading.Thread(target=poll, kwargs={"cancelled": b_probe}, daemon=True)
    a.start()
    b.start()
    time.sleep(0.2)  # not needed for the verdict: a wait that starts cancelled returns at once as well
    cancelled.set()
    jobs.wake()
    a.join(HANG_BOUND_SECONDS)
    assert not a.is_alive() and b.is_alive() and len(results) == 1
    # Released only once b waits (a release before its wait began would not concern it).
    assert b_waits.wait(HANG_BOUND_SECONDS)
    jobs.release_waiters()
    b.join(HANG_BOUND_SECONDS)
    assert not b.is_alive() and len(results) == 2
    assert all(r.state_version == 1 for r in results)


# ---------------------------------------------------------------- concurrency


def test_concurrent_ready_joiners_never_exceed_the_target():
    jobs = elastic("h:1", "h:2", max_size=64)
    jobs.set_signature(SIG)
    jobs.request_size(7)
    barrier = threading.Barrier(16)

    def ready(i):
        barrier.wait()
        jobs.joiner_ready(p(f"j:{i + 1}"), SIG)

    threads = [threading.Thread(target=ready, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = jobs.job_state()
    assert len(state.cluster.workers) == 7
    assert all(len(jobs.cluster_at(v).workers) <= 7 for v in range(1, state.cluster.version + 1))
    assert len(state.joiners) == 11 and all(j.state == Joiner.READY for j in state.joiners)
    members = set(cluster_peers(state.cluster))
    assert members.isdisjoint(peer_string(j.peer) for j in state.joiners)


# ---------------------------------------------------------- admission window


class FakeClock:
    """Seconds that advance only when a test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def growing(*joiner_peers: str, window: float = 5.0, size: int = 4) -> tuple[JobStateMachine, FakeClock]:
    """One member h:1 with the signature set, grown to ``size``; ``joiner_peers`` placed (STARTING)."""
    clock = FakeClock()
    jobs = elastic("h:1", max_size=8, admit_window=window, clock=clock)
    jobs.set_signature(SIG)
    jobs.request_size(size)
    for peer in joiner_peers:
        jobs.add_joiner(p(peer))
    return jobs, clock


def versions(jobs: JobStateMachine) -> list[list[str]]:
    """The workers of every committed version, in order."""
    return [cluster_peers(jobs.cluster_at(v)) for v in range(1, jobs.cluster().version + 1)]


def test_joiners_ready_at_different_times_are_admitted_in_one_version():
    jobs, clock = growing("h:2", "h:3", "h:4")
    state = jobs.joiner_ready(p("h:3"), SIG)  # t = 0: the window opens
    assert state.cluster.version == 1 and jobs.admission_deadline() == 5.0
    clock.now = 0.5
    assert jobs.joiner_ready(p("h:2"), SIG).cluster.version == 1
    clock.now = 0.9
    assert jobs.admit_due().cluster.version == 1  # the window is open: nothing is due
    clock.now = 1.0
    state = jobs.joiner_ready(p("h:4"), SIG)  # the last expected one: admitted at once, before the window ends
    assert versions(jobs) == [["h:1"], ["h:1", "h:3", "h:2", "h:4"]]
    assert jobs.commit_reason(2) == "admitted h:3, h:2, h:4"
    assert not state.joiners and jobs.admission_deadline() is None


def test_a_joiner_that_never_gets_ready_delays_the_others_by_the_window_only():
    jobs, clock = growing("h:2", "h:3", "h:4")
    jobs.joiner_ready(p("h:2"), SIG)
    clock.now = 2.0
    jobs.joiner_ready(p("h:3"), SIG)
    assert jobs.admission_deadline() == 5.0  # counted from the first READY one
    clock.now = 4.999
    assert jobs.admit_due().cluster.version == 1
    clock.now = 5.0
    state = jobs.admit_due()
    assert versions(jobs) == [["h:1"], ["h:1", "h:2", "h:3"]]
    assert joiners(state) == {"h:4": Joiner.STARTING} and jobs.admission_deadline() is None
    # The straggler, once READY, is alone in its growth: admitted at once.
    clock.now = 60.0
    state = jobs.joiner_ready(p("h:4"), SIG)
    assert state.cluster.version == 3 and cluster_peers(state.cluster)[-1] == "h:4"


def test_without_a_window_each_joiner_is_admitted_when_ready():
    jobs, clock = growing("h:2", "h:3", "h:4", window=0)
    for t, peer in ((0.0, "h:3"), (0.5, "h:2"), (1.0, "h:4")):
        clock.now = t
        jobs.joiner_ready(p(peer), SIG)
    assert versions(jobs) == [["h:1"], ["h:1", "h:3"], ["h:1", "h:3", "h:2"], ["h:1", "h:3", "h:2", "h:4"]]
    assert jobs.admission_deadline() is None


def test_a_joiner_removed_or_rejected_while_others_wait_lets_them_in():
    jobs, clock = growing("h:2", "h:3", "h:4")
    jobs.joiner_ready(p("h:2"), SIG)
    clock.now = 1.0
    jobs.joiner_ready(p("h:3"), OTHER_SIG)  # REJECTED: no longer expected, h:4 still is
    assert jobs.job_state().cluster.version == 1
    clock.now = 2.0
    state = jobs.remove_joiner(p("h:4"))  # withdrawn: nobody else to wait for
    assert versions(jobs) == [["h:1"], ["h:1", "h:2"]]
    assert joiners(state) == {"h:3": Joiner.REJECTED} and jobs.admission_deadline() is None


def test_the_window_counts_only_joiners_that_fit_under_the_target():
    # Target 3 (two joiners fit), three placed: once two are READY nobody else is waited for.
    jobs, clock = growing("h:2", "h:3", "h:4", size=3)
    jobs.joiner_ready(p("h:4"), SIG)
    assert jobs.job_state().cluster.version == 1
    clock.now = 0.3
    state = jobs.joiner_ready(p("h:2"), SIG)
    assert versions(jobs) == [["h:1"], ["h:1", "h:4", "h:2"]]
    assert joiners(state) == {"h:3": Joiner.STARTING}
    # A single replacement (nobody else STARTING) is admitted at once, window or not.
    jobs, clock = growing("h:2", size=2)
    assert jobs.joiner_ready(p("h:2"), SIG).cluster.version == 2


def test_a_window_that_ends_after_the_job_stopped_growing_admits_nothing():
    jobs, clock = growing("h:2", "h:3")
    jobs.joiner_ready(p("h:2"), SIG)
    jobs.request_size(1)  # the growth was called off: no room, the window closes
    assert jobs.admission_deadline() is None
    clock.now = 10.0
    assert jobs.admit_due().cluster.version == 1


@pytest.mark.parametrize("window", [-1.0, math.nan, math.inf, "5", True])
def test_bad_admit_window(window):
    with pytest.raises(ValueError, match=rf"admit_window must be a finite number of seconds >= 0, got {window!r}"):
        elastic("h:1", admit_window=window)


def test_admission_timer_ends_the_window_on_time():
    jobs = elastic("h:1", max_size=4, admit_window=0.3)
    jobs.set_signature(SIG)
    jobs.request_size(3)
    jobs.add_joiner(p("h:2"))
    jobs.add_joiner(p("h:3"))
    timer = threading.Thread(target=jobs.run_admission_timer)
    timer.start()
    try:
        start = time.monotonic()
        state = jobs.joiner_ready(p("h:2"), SIG)
        # The timer ends the window (h:3 never comes): waited for up to the
        # hang bound, which only rules out "never"; not before the window.
        while state.cluster.version == 1 and time.monotonic() - start < HANG_BOUND_SECONDS:
            state = jobs.wait(state.state_version, 10)
        waited = time.monotonic() - start
        assert cluster_peers(state.cluster) == ["h:1", "h:2"]
        assert waited >= 0.3, waited
    finally:
        jobs.stop_admission_timer()
        timer.join(HANG_BOUND_SECONDS)
    assert not timer.is_alive()
