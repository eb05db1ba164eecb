"""GNSResizePolicy (KungFu Listing 1) in one process: its decision rule against a literal transcription
of Listing 1, the runner's agreed ``resize`` request (with a stand-in for the elastic resize op), and bad
arguments. The resize itself (workers joining/leaving) is tested end to end in tests/test_elastic_*.py.
"""

from __future__ import annotations

import json
import math

import pytest
import tensorflow as tf

from kungfu_tf.policy import BasePolicy, GNSResizePolicy, PolicyRunner


def listing_one(gns_per_epoch: list[float], size: int, max_size: int | None = None) -> list[int | None]:
    """KungFu's Listing 1 lines 19-28 as printed (plus the cap), on a simulated cluster: the size asked for
    after each epoch (None: no resize call)."""
    prev, out = None, []
    for avg_gns in gns_per_epoch:
        asked = None
        if prev is None:
            prev = avg_gns
        elif avg_gns > prev:
            new_size = int(size * avg_gns / prev)
            if max_size is not None:
                new_size = min(new_size, max_size)
            if new_size != size and new_size > size:
                asked = size = new_size
            prev = avg_gns
        out.append(asked)
    return out


class FakeContext:
    """The part of PolicyContext the policy uses; a resize is applied at once."""

    def __init__(self, size: int):
        self.size, self.step, self.epoch = size, 0, 0
        self.metrics: dict = {}
        self.asked: list[int | None] = []

    def resize(self, new_size, reason=""):
        assert reason.startswith("gns ")
        self.asked[-1] = new_size
        self.size = new_size


@pytest.mark.parametrize(
    ("gns", "size", "max_size"),
    [
        ([10.0, 20.0, 15.0, 30.0, 31.0, 90.0], 1, None),  # x2 -> 2, a dip (reference kept), 3, x1.03 (no resize, reference moves), 8
        ([100.0, 150.0, 149.0, 300.0, 600.0], 2, 8),  # 3, -, 6, capped at 8
        ([50.0, 40.0, 30.0, 20.0], 4, None),  # shrinking GNS: never shrinks the cluster
        ([10.0, 11.0, 12.0, 13.0, 40.0], 3, None),  # small growth: int(3*1.1) = 3, reference still moves
    ],
)
def test_decisions_follow_listing_one(gns, size, max_size):
    policy = GNSResizePolicy(max_size=max_size)
    ctx = FakeContext(size)
    for epoch, g in enumerate(gns):
        ctx.epoch, ctx.metrics["gns"] = epoch, g
        ctx.asked.append(None)
        policy.after_epoch(ctx)
    assert ctx.asked == listing_one(gns, size, max_size)
    assert any(ctx.asked) or gns[0] >= gns[-1]


def test_no_estimate_no_decision_and_a_cap_below_the_size_never_shrinks():
    policy = GNSResizePolicy(max_size=2)
    assert [policy.decide(g, 4) for g in (math.nan, 0.0, 10.0, 100.0)] == [None, None, None, None]
    assert policy.reference == 100.0


def test_every_and_unit_choose_the_checks():
    p = GNSResizePolicy(every=3, unit="step")
    assert [s for s in range(9) if p.runs_at("after_step", s, 0)] == [2, 5, 8]
    assert not p.runs_at("after_epoch", 5, 2)
    e = GNSResizePolicy(every=2)
    assert [ep for ep in range(5) if e.runs_at("after_epoch", 0, ep)] == [1, 3]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_size": 0}, "max_size must be a positive int or None, got 0"),
        ({"every": 0}, "every must be a positive int, got 0"),
        ({"unit": "minute"}, "unit must be one of step, epoch, got 'minute'"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GNSResizePolicy(**kwargs)


class TableMonitor:
    def __init__(self, table):
        self.local_batch_size = tf.Variable(0, dtype=tf.int64)
        self.table, self.step = table, 0

    def values(self):
        return {"gns": self.table[self.step]}


@pytest.fixture
def fake_resize(monkeypatch):
    """Stands in for kungfu_tf.ops.resize (the elastic runtime): records the calls, grows 'later'."""
    import importlib

    resize_module = importlib.import_module("kungfu_tf.ops.resize")  # kungfu_tf.ops.resize is also the function
    calls = []

    def resize(new_size=None, *, workers=None, wait=False):
        calls.append(new_size)
        return tf.constant(False), tf.constant(False)  # a growth: pending until joiners are ready

    monkeypatch.setattr(resize_module, "resize", resize)
    return calls


def test_runner_agrees_on_the_resize_and_calls_the_resize_op(fake_resize):
    monitor = TableMonitor([10.0, 10.0, 25.0, 25.0, 40.0])
    runner = PolicyRunner([GNSResizePolicy(max_size=4, unit="step")], batch_size=8, monitor=monitor, verbose=False)
    with runner.training():
        for _ in range(5):
            with runner.step():
                monitor.step = runner.steps_done
    # One worker: 25/10 -> int(2.5) = 2 after step 2; the fake never grows, so the growth to 2 is still
    # pending at step 4, and 40/25 grows it to int(2 * 1.6) = 3 (not int(1 * 1.6) = 1, which lost the growth).
    assert fake_resize == [2, 3]
    first, second = [d for d in runner.history if d.name == "size"]
    assert (first.step, first.old, first.new, first.requested_by) == (3, 1, 2, "GNSResizePolicy")  # after 3 steps
    assert (second.step, second.old, second.new) == (5, 1, 3)
    assert first.refused.startswith("pending") and second.refused.startswith("pending")
    assert "(from the 2 workers asked for)" in second.reason
    assert not runner.detached and runner.size == 1 and runner.batch_size == 8


def test_a_check_while_a_growth_is_pending_grows_from_the_size_asked_for():
    """Listing 1's resize has returned with the new workers by the next check; here joiners warm up while the
    members train on, so a check may come first: it scales the size asked for, and the real size once reached."""

    class SlowContext(FakeContext):
        def resize(self, new_size, reason=""):
            self.asked[-1] = new_size  # pending: the size changes when the test says so

    policy, ctx = GNSResizePolicy(max_size=8), SlowContext(1)
    for g, arrived in ((10.0, 1), (25.0, 1), (40.0, 1), (50.0, 3), (80.0, 3), (85.0, 3)):
        ctx.size = arrived
        ctx.metrics["gns"] = g
        ctx.asked.append(None)
        policy.after_epoch(ctx)
    # 25/10: 1 -> 2; 40/25 with 2 pending: int(2 * 1.6) = 3; 50/40 at 3 (arrived): int(3.75) = 3, nothing;
    # 80/50 at 3: int(4.8) = 4; 85/80 with 4 pending: int(4.25) = 4, nothing.
    assert ctx.asked == [None, 2, 3, None, 4, None]
    assert policy.state_dict() == {"reference": 85.0, "asked": 4}
    ctx.size = 4
    ctx.metrics["gns"] = 200.0
    ctx.asked.append(None)
    policy.after_epoch(ctx)
    assert ctx.asked[-1] == 8 and policy.state_dict() == {"reference": 200.0, "asked": 8}


def test_resize_request_is_checked_and_only_from_a_hook():
    class Bad(BasePolicy):
        def __init__(self, value):
            self.value = value

        def after_step(self, ctx):
            ctx.resize(self.value)

    for value, error, message in ((0, ValueError, "resize: new_size must be positive, got 0"),
                                  (2.0, TypeError, "resize: new_size must be an int, got 2.0")):  # fmt: skip
        runner = PolicyRunner([Bad(value)], verbose=False)
        runner.before_train()
        runner.before_step()
        with pytest.raises(error, match=message):
            runner.after_step()  # the policy fails in its after_step
    with pytest.raises(RuntimeError, match="resize may only be called from a policy hook"):
        runner.context.resize(2)


def test_runner_state_dict_carries_counters_and_policy_references_to_a_joiner(fake_resize):
    monitor = TableMonitor([10.0, 10.0, 25.0, 25.0])
    members = PolicyRunner([GNSResizePolicy(max_size=4, unit="step")], batch_size=8, monitor=monitor, verbose=False)
    with members.training():
        for _ in range(4):
            with members.step():
                monitor.step = members.steps_done
    state = json.loads(json.dumps(members.state_dict()))  # JSON-able, as the elastic state sync carries it
    joiner = PolicyRunner([GNSResizePolicy(max_size=4, unit="step")], batch_size=8, monitor=monitor, verbose=False)
    joiner.before_train()
    joiner.load_state_dict(state)
    assert joiner.state_dict() == members.state_dict()
    assert joiner.policies[0].reference == 25.0 and joiner.policies[0].asked == 2 and joiner.steps_done == 4
    with pytest.raises(ValueError, match="the state holds 1 policies' states, this runner has 0 policies"):
        PolicyRunner([]).load_state_dict(state)
