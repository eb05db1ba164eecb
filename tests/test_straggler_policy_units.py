"""StragglerPolicy (Or et al. Algorithm 1) on simulated clusters: its averages against a closed-form numpy
EWMA, persistent vs occasional slowness, a straggler fast every N-1th step, averages that follow peers
across rank changes, the replace-then-evict sequence, --max-np, identical decisions on every worker,
the state a joiner gets, and bad arguments. With real workers: tests/test_straggler_policy.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kungfu_tf.policy import PolicyRunner, StragglerPolicy
from kungfu_tf.policy.straggler import FractionAverages

ALPHA = 0.1


def reference_averages(throughputs: np.ndarray, alpha: float = ALPHA) -> np.ndarray:
    """Closed form of Algorithm 1 for workers measured at every step: throughputs [steps, workers] ->
    averages [workers] = (1-a)^n * 1.0 + sum_k a (1-a)^(n-1-k) f_k, f = throughput / median of the others' in
    its step."""
    others = [np.median(np.delete(throughputs, j, axis=1), axis=1) for j in range(throughputs.shape[1])]
    fractions = throughputs / np.stack(others, axis=1)
    n = len(fractions)
    weights = alpha * (1 - alpha) ** np.arange(n - 1, -1, -1)
    return (1 - alpha) ** n + weights @ fractions


class SimWorker:
    """The PolicyContext of one simulated worker; requests are recorded, the cluster is the simulation's."""

    def __init__(self, sim: Simulation, peer: str):
        self.sim, self.self_peer = sim, peer
        self.metrics: dict = {}
        self.requests: list[tuple] = []
        self.lines: list[str] = []

    # what the policy reads
    @property
    def peers(self):
        return tuple(self.sim.peers)

    @property
    def size(self):
        return len(self.sim.peers)

    @property
    def step(self):
        return self.sim.step

    @property
    def local_batch_size(self):
        return 8

    @property
    def size_bounds(self):
        return self.sim.bounds

    def all_gather(self, value, name=None):
        assert name == "kungfu_policy/straggler_throughputs"
        row = self.sim.peers.index(self.self_peer)
        assert np.array_equal(value, self.sim.table[row], equal_nan=True)  # its own row is what it sent
        return self.sim.table

    def resize(self, new_size=None, reason="", *, workers=None):
        self.requests.append((self.sim.step + 1, new_size, None if workers is None else tuple(workers), reason))

    def log(self, text):
        self.lines.append(f"step {self.sim.step + 1}: {text}")


class Simulation:
    """Workers (one policy each) stepping in lock-step; ``throughput(step, peer)`` is what each measures."""

    def __init__(self, peers, throughput, bounds=(1, 8), **policy_args):
        self.peers, self.throughput, self.bounds = list(peers), throughput, bounds
        self.policy_args = policy_args
        self.step = 0
        self.table = None
        self.workers = {p: (StragglerPolicy(**policy_args), SimWorker(self, p)) for p in peers}

    def join(self, peer: str, state_from: str) -> None:
        policy = StragglerPolicy(**self.policy_args)
        policy.load_state_dict(json.loads(json.dumps(self.workers[state_from][0].state_dict())))
        self.workers[peer] = (policy, SimWorker(self, peer))
        self.peers.append(peer)

    def leave(self, peer: str) -> None:
        self.peers.remove(peer)
        del self.workers[peer]

    def run(self, steps: int, apply=None) -> None:
        """``steps`` steps, each as ``after_step`` runs it (measure; check every ``every`` steps, else follow a
        cluster change); after each step ``apply(requests)`` may change the cluster (the runner's resize)."""
        for _ in range(steps):
            before = {p: len(self.workers[p][1].requests) for p in self.peers}
            lines_before = {p: len(self.workers[p][1].lines) for p in self.peers}
            for peer in self.peers:
                self.workers[peer][1].metrics = {"compute_time": 8 / self.throughput(self.step, peer)}
            if (self.step + 1) % self.workers[self.peers[0]][0].every == 0:
                # after_step's check needs every worker's window first (the all-gather): measure all, then check
                for peer in self.peers:
                    policy, ctx = self.workers[peer]
                    policy.measure(ctx)
                self.table = np.stack([self.workers[p][0].window(self.step) for p in self.peers])
                for peer in list(self.peers):
                    policy, ctx = self.workers[peer]
                    policy.check(ctx)
            else:
                for peer in list(self.peers):
                    policy, ctx = self.workers[peer]
                    policy.after_step(ctx)  # measure, and follow a cluster change between checks
            new = {p: self.workers[p][1].requests[before[p]:] for p in self.peers}
            assert len({json.dumps(r) for r in new.values()}) == 1, new  # identical on every worker
            states = {json.dumps(self.workers[p][0].state_dict(), sort_keys=True) for p in self.peers}
            assert len(states) == 1
            logged = {json.dumps(self.workers[p][1].lines[lines_before[p]:]) for p in self.peers}
            assert len(logged) == 1, logged  # the joiner decides and logs as the members do
            if apply is not None and new[self.peers[0]]:
                apply(new[self.peers[0]])
            self.step += 1

    def policy(self, peer: str | None = None) -> StragglerPolicy:
        return self.workers[peer or self.peers[0]][0]

    def ctx(self, peer: str | None = None) -> SimWorker:
        return self.workers[peer or self.peers[0]][1]


PEERS = ["h:1", "h:2", "h:3"]


def test_averages_match_the_closed_form_ewma_and_only_persistent_slowness_is_caught():
    rng = np.random.default_rng(0)
    steps = 40
    speeds = 100.0 * (1 + 0.05 * rng.standard_normal((steps, 4)))
    speeds[:, 2] *= 0.5  # h:3: persistently 2x slower
    speeds[::10, 3] *= 0.25  # h:4: 4x slower on one step in ten (occasional)
    peers = [*PEERS, "h:4"]
    sim = Simulation(peers, lambda s, p: speeds[s, peers.index(p)], bounds=None, every=10, warmup_steps=0)
    sim.run(steps)
    want = reference_averages(speeds)
    got = sim.policy().averages
    np.testing.assert_allclose([got[p] for p in peers], want, rtol=1e-12)
    assert want[2] < 0.8 < want[3] < 1.0
    # checks after 10, 20, 30, 40 steps; 1 - 0.5 * (1 - 0.9**10) = 0.67: caught at the first
    lines = sim.ctx().lines
    assert "straggler h:3 (average 0.6" in lines[1] and "kept: not an elastic job" in lines[1]
    assert not any("h:4 (average" in line for line in lines)
    assert sim.ctx().metrics["straggler/fraction/h:3"] == pytest.approx(want[2])
    assert sim.ctx().metrics["straggler/median_throughput"] == pytest.approx(np.median(speeds[-1]))


def test_a_straggler_fast_every_n_minus_1th_step_is_still_caught():
    every = 10

    def speed(step, peer):
        if peer != "h:3":
            return 100.0
        return 100.0 if step % (every - 1) == every - 2 else 40.0  # never slow N steps in a row

    # "slow for N steps in a row" (the alternative the paper rejects) never fires
    slow = [speed(s, "h:3") < 80.0 for s in range(60)]
    assert max(len(run) for run in "".join("x" if x else "." for x in slow).split(".")) < every
    sim = Simulation(PEERS, speed, bounds=(1, 4), every=every, warmup_steps=0)
    sim.run(every)
    assert sim.ctx().requests == [(10, 4, None, sim.ctx().requests[0][3])]
    assert "replacement for straggler h:3" in sim.ctx().requests[0][3]
    table = np.array([[speed(s, p) for p in PEERS] for s in range(every)])
    assert sim.policy().averages["h:3"] == pytest.approx(reference_averages(table)[2])


def test_averages_follow_peers_not_ranks_across_membership_changes():
    speeds = {"h:1": 100.0, "h:2": 50.0, "h:3": 100.0, "h:4": 100.0}
    sim = Simulation(PEERS, lambda s, p: speeds[p], bounds=None, every=5, warmup_steps=2)
    sim.run(5)  # steps 0-1 not measured: 3 samples
    slow_after_3 = reference_averages(np.array([[100.0, 50.0, 100.0]] * 3))[1]
    assert sim.policy().averages["h:2"] == pytest.approx(slow_after_3)
    # h:1 leaves and h:4 joins: h:2 moves from rank 1 to rank 0, the joiner is new (starts at 1.0)
    sim.leave("h:1")
    sim.join("h:4", state_from="h:2")
    assert sim.peers == ["h:2", "h:3", "h:4"]
    sim.run(5)  # steps 5-6 not measured after the change: 3 more samples
    averages = sim.policy().averages
    assert set(averages) == {"h:2", "h:3", "h:4"}  # the departed h:1 is forgotten
    assert averages["h:2"] == pytest.approx(reference_averages(np.array([[100.0, 50.0, 100.0]] * 6))[1])
    assert averages["h:4"] == pytest.approx(reference_averages(np.array([[50.0, 100.0, 100.0]] * 3))[2])
    # keyed by rank instead, h:2's history would now belong to rank 0's new occupant and vice versa
    # After the change both run at 100 against the others' median 75: h:4 from 1.0, h:3 from its own history.
    decay, fraction = (1 - ALPHA) ** 3, 100.0 / 75.0
    h3_before = reference_averages(np.array([[100.0, 50.0, 100.0]] * 3))[2]
    assert averages["h:3"] == pytest.approx(decay * h3_before + (1 - decay) * fraction)
    assert averages["h:4"] == pytest.approx(decay * 1.0 + (1 - decay) * fraction)


def test_replacement_joins_first_then_the_straggler_is_evicted_and_the_size_never_drops():
    speeds = {"h:1": 100.0, "h:2": 100.0, "h:3": 30.0, "h:4": 100.0}
    sim = Simulation(PEERS, lambda s, p: speeds[p], bounds=(2, 4), every=5, warmup_steps=0)
    sizes, events = [], []

    def apply(requests):
        (step, new_size, workers, _reason) = requests[-1]
        events.append((step, new_size, workers))
        if workers is not None:
            for p in [p for p in sim.peers if p not in workers]:
                sim.leave(p)
        # a growth is asynchronous: the joiner is admitted later (below)

    for _ in range(4):
        sim.run(5, apply)
        sizes.append(len(sim.peers))
        if events and events[-1][1] == 4 and "h:4" not in sim.peers and sim.step >= 10:
            sim.join("h:4", state_from="h:1")  # admitted some steps after the request
    # joined after step 9 (the check at 10 still waited): evicted after the next step, not at the check of step 15
    assert events == [(5, 4, None), (11, None, ("h:1", "h:2", "h:4"))]
    assert sizes == [3, 3, 3, 3] and min(sizes) >= 3
    lines = [line.split(": ", 1)[1] for line in sim.ctx("h:1").lines]
    assert [line for line in lines if not line.startswith("straggler check")] == [
        f"straggler h:3 (average {1 - 0.7 * (1 - 0.9**5):.3f} < 0.8): asked for a replacement (3 -> 4)",
        "straggler h:3: waiting for its replacement (asked at step 5, 3 workers); keeping it until then",
        "evicting straggler h:3: its replacement has joined (3 -> 4 workers)",
        "straggler h:3 has left the cluster (3 workers): replacement done",  # seen at the next step
        "no straggler: every average is >= 0.8",  # the round is over: the checks at 15 and 20 look again
        "no straggler: every average is >= 0.8",
    ]
    assert sim.policy().state_dict()["replaced"] == 1 and sim.policy().pending is None
    assert sim.ctx("h:1").metrics["straggler/replaced"] == 1.0


def test_the_straggler_is_evicted_at_the_first_step_after_its_replacement_joined_not_at_the_next_check():
    """With every=10 and the replacement joining after step 12, the straggler used to stay (and set the pace
    of all three) until the check after step 19; now every member, the joiner included, evicts it after the
    first step they run together, and logs alike (Simulation asserts identical requests, state and lines)."""
    speeds = {"h:1": 100.0, "h:2": 25.0, "h:3": 100.0}
    sim = Simulation(["h:1", "h:2"], lambda s, p: speeds[p], bounds=(1, 3), every=10, warmup_steps=2)
    requests = []

    def apply(new):
        requests.extend(new)
        (_step, _size, workers, _reason) = new[-1]
        if workers is not None:
            for p in [p for p in sim.peers if p not in workers]:
                sim.leave(p)

    sim.run(10, apply)  # 8 steps measured at 1/4: below at the first check, which two workers need twice
    assert requests == [] and "h:2 (average 0.573)" in sim.ctx().lines[-1] and "first check" in sim.ctx().lines[-1]
    sim.run(10, apply)
    assert [(r[0], r[1]) for r in requests] == [(20, 3)]  # caught at the second check in a row
    sim.run(3, apply)  # steps 20-22 at the straggler's pace while the replacement starts
    assert len(requests) == 1 and sim.policy().pending == {"peers": ["h:2"], "size": 2, "step": 20}
    sim.join("h:3", state_from="h:1")
    sim.run(1, apply)  # step 23: the first with the joiner
    assert requests[1][:3] == (24, None, ("h:1", "h:3"))
    assert "evict straggler h:2: the cluster grew from 2 to 3 workers" in requests[1][3]
    assert sim.peers == ["h:1", "h:3"]
    sim.run(6, apply)  # to the check after step 29: the round ends when the straggler is seen gone
    assert len(requests) == 2 and sim.policy().pending is None and sim.policy().state_dict()["replaced"] == 1
    lines = [line for line in sim.ctx("h:3").lines if "straggler check" not in line]
    assert lines == ["step 24: evicting straggler h:2: its replacement has joined (2 -> 3 workers)",
                     "step 25: straggler h:2 has left the cluster (2 workers): replacement done",
                     "step 30: no straggler: every average is >= 0.8"]  # fmt: skip


def test_at_max_np_the_straggler_is_kept_and_logged():
    sim = Simulation(PEERS, lambda s, p: 20.0 if p == "h:1" else 100.0, bounds=(1, 3), every=4, warmup_steps=0)
    sim.run(8)
    assert sim.ctx().requests == []
    kept = [line for line in sim.ctx().lines if "kept" in line]
    assert kept == [f"step {s}: straggler h:1 (average {a:.3f}) kept: the job is at --max-np 3, no room for a replacement"
                    for s, a in ((4, reference_averages(np.array([[20.0, 100, 100]] * 4))[0]),
                                 (8, reference_averages(np.array([[20.0, 100, 100]] * 8))[0]))]  # fmt: skip


def test_every_straggler_of_a_check_in_one_round_the_slowest_first():
    """Or et al. Fig. 9 replaces up to 10 stragglers at once; one per round took a round (the replacement's
    start-up and `every` steps) per straggler."""
    speeds = {"h:1": 50.0, "h:2": 30.0, "h:3": 100.0, "h:4": 100.0}
    sim = Simulation(list(speeds), lambda s, p: speeds[p], bounds=(1, 8), every=5, warmup_steps=0)
    sim.run(15)
    assert [r[1] for r in sim.ctx().requests] == [6]  # two replacements asked for at once
    assert sim.policy().pending == {"peers": ["h:2", "h:1"], "size": 4, "step": 5}


def test_replacements_that_arrive_one_by_one_evict_one_straggler_each_and_max_np_limits_the_round():
    speeds = {"h:1": 50.0, "h:2": 30.0, "h:3": 100.0, "h:4": 100.0, "h:5": 100.0, "h:6": 100.0}
    sim = Simulation(["h:1", "h:2", "h:3", "h:4"], lambda s, p: speeds[p], bounds=(1, 5), every=5, warmup_steps=0)
    evictions = []

    def apply(requests):
        (_step, _new_size, workers, _reason) = requests[-1]
        if workers is not None:
            evictions.append(sorted(set(sim.peers) - set(workers)))
            for p in [p for p in sim.peers if p not in workers]:
                sim.leave(p)

    sim.run(5, apply)  # --max-np 5: room for one replacement, the slowest (h:2); h:1 kept for now
    assert [r[1] for r in sim.ctx().requests] == [5] and sim.policy().pending["peers"] == ["h:2"]
    assert any("stragglers h:1 kept for now: --max-np 5 leaves room for 1" in line for line in sim.ctx().lines)
    sim.join("h:5", state_from="h:3")
    sim.run(5, apply)
    assert evictions == [["h:2"]] and sim.peers == ["h:1", "h:3", "h:4", "h:5"]
    sim.run(5, apply)  # the next round takes h:1
    assert sim.policy().pending["peers"] == ["h:1"] and len(sim.peers) == 4


def test_a_pending_replacement_saved_by_the_one_straggler_version_is_adopted():
    policy = StragglerPolicy()
    policy.load_state_dict({"averages": {"h:2": 0.5}, "pending": {"peer": "h:2", "size": 3, "step": 7}, "replaced": 1})
    assert policy.pending == {"peers": ["h:2"], "size": 3, "step": 7}


def test_the_policy_in_a_runner_gathers_one_row_per_worker_and_writes_metrics():
    class Monitor:
        def __init__(self):
            import tensorflow as tf

            self.local_batch_size = tf.Variable(0, dtype=tf.int64)

        def values(self):
            return {"compute_time": 0.01}

    runner = PolicyRunner([StragglerPolicy(every=3, warmup_steps=1)], batch_size=4, monitor=Monitor(), verbose=False)
    with runner.training():
        for _ in range(6):
            with runner.step():
                pass  # no training work: the test checks the runner's bookkeeping afterwards
    checks = [line for line in runner.log_lines if "straggler check" in line]
    # one worker: no median to compare with; nobody is a straggler
    assert checks == [f"step {s}: straggler check: EWMA of throughput / median: none measured yet (threshold 0.8, "
                      f"0 of 3 steps measured, last median n/a/s) [StragglerPolicy]" for s in (3, 6)]  # fmt: skip
    assert runner.policies[0]._samples == {}
    assert runner.context.metrics["straggler/pending"] == 0.0


def test_two_workers_a_1_3x_slower_one_is_a_straggler():
    """Against the median of all, with two workers each was compared with their mean: a worker 1.3x slower
    had the fraction 2 / 2.3 = 0.87 > 0.8 and was never replaced (up to 1.5x went unnoticed)."""
    a = FractionAverages(alpha=1.0)
    a.record({"h:1": 130.0, "h:2": 100.0})
    assert a.averages["h:2"] == pytest.approx(100 / 130) and a.slowest_below(0.8, ["h:1", "h:2"]) == "h:2"


def test_two_workers_a_dip_for_one_check_replaces_nobody_a_straggler_below_at_two_checks_is_replaced():
    """With two workers each is compared with the other alone: a healthy worker that ran 2x slower for one
    check's steps (a shared core, a replacement starting on the same host) fell to 0.79 < 0.8 and was replaced
    (the 2-worker benchmark replaced four healthy workers at 0.73-0.80 that were back above 0.8 a check
    later). Below at two checks in a row with the same partner is a straggler; below at one is not."""
    every = 5

    def dip(step, peer):  # h:2 is 2x slower in steps 5-9 only: averages 1 -> 0.795 -> 0.879 -> ...
        return 50.0 if peer == "h:2" and every <= step < 2 * every else 100.0

    sim = Simulation(["h:1", "h:2"], dip, bounds=(1, 3), every=every, warmup_steps=0)
    sim.run(6 * every)
    assert sim.ctx().requests == []  # before: a replacement for h:2 at step 10
    assert sim.policy().averages["h:2"] > 0.8
    below_at = [line for line in sim.ctx().lines if "is below 0.8 at its first check" in line]
    expected = (f"step {2 * every}: h:2 (average 0.795) is below 0.8 at its first check: with two workers each is "
                "compared with the other alone, so it must stay below at the next check too")  # fmt: skip
    assert below_at == [expected]

    # The same worker 2x slower for good: below at the checks after steps 9 and 14, replaced after the second.
    sim = Simulation(["h:1", "h:2"], lambda s, p: 50.0 if p == "h:2" and s >= every else 100.0,
                     bounds=(1, 3), every=every, warmup_steps=0)  # fmt: skip
    sim.run(3 * every)
    assert [(r[0], r[1]) for r in sim.ctx().requests] == [(3 * every, 3)]
    assert "replacement for straggler h:2 (average 0.6" in sim.ctx().requests[0][3]


def test_two_workers_below_before_and_after_a_change_of_partner_is_one_check_not_two():
    """A check against another partner says nothing about the new pair: after the cluster changed, a worker
    must be below at two checks of the new pair (the dip the last replacement's start-up caused does not
    count twice)."""
    speeds = {"h:1": 100.0, "h:2": 100.0, "h:3": 100.0}
    sim = Simulation(["h:1", "h:2", "h:3"], lambda s, p: 50.0 if p == "h:1" else speeds[p], bounds=None, every=5,
                     warmup_steps=0)  # fmt: skip
    sim.run(5)  # three workers: h:1 below at this check (and named at once: Algorithm 1)
    assert "straggler h:1 (average 0.795" in sim.ctx().lines[-1]
    sim.leave("h:3")
    sim.run(5)  # the pair h:1, h:2: h:1 below again, but at the pair's first check
    assert "h:1 (average 0.674)" in sim.ctx().lines[-1] and "first check" in sim.ctx().lines[-1]
    sim.run(5)  # the pair's second: now a straggler (kept: not an elastic job)
    assert "straggler h:1 (average 0.603" in sim.ctx().lines[-1] and "kept: not an elastic job" in sim.ctx().lines[-1]


def test_fraction_averages_skip_steps_with_fewer_than_two_measured_workers():
    a = FractionAverages(alpha=0.5)
    assert a.record({"h:1": 10.0, "h:2": math.nan}) == {} and a.averages == {}
    # each against the median of the others measured: h:3 (0: not measured) is left out
    assert a.record({"h:1": 10.0, "h:2": 5.0, "h:3": 0.0}) == {"h:1": pytest.approx(2.0), "h:2": pytest.approx(0.5)}
    assert a.slowest_below(0.9, ["h:1", "h:2"]) == "h:2" and a.slowest_below(0.5, ["h:1", "h:2"]) is None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"threshold": 1.5}, ValueError, r"threshold must be a number in \[0, 1\], got 1.5"),
        ({"threshold": -0.1}, ValueError, r"threshold must be a number in \[0, 1\], got -0.1"),
        ({"threshold": math.nan}, ValueError, r"threshold must be a number in \[0, 1\], got nan"),
        ({"threshold": True}, TypeError, r"threshold must be a number in \[0, 1\], got True"),
        ({"alpha": 0}, ValueError, r"alpha must be a number in \(0, 1\], got 0"),
        ({"alpha": 1.01}, ValueError, r"alpha must be a number in \(0, 1\], got 1.01"),
        ({"every": 0}, ValueError, "every must be a positive int, got 0"),
        ({"every": 2.0}, ValueError, "every must be a positive int, got 2.0"),
        ({"warmup_steps": -1}, ValueError, "warmup_steps must be an int >= 0, got -1"),
    ],
)
def test_bad_arguments_name_the_argument_and_value(kwargs, error, message):
    with pytest.raises(error, match=f"StragglerPolicy: {message}"):
        StragglerPolicy(**kwargs)
