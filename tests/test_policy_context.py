"""PolicyContext's cluster view and decision log in one process: peers, self_peer, size_bounds,
resize(workers=...) passed to kungfu_tf.ops.resize, ctx.log and policy metrics in TensorBoard.

The multi-worker behaviour (a real eviction) is in tests/test_straggler_policy.py (StragglerPolicy).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.ops import elastic_membership as em
from kungfu_tf.ops import membership
from kungfu_tf.ops import resize as _load_resize_module  # noqa: F401 -- puts kungfu_tf.ops.resize in sys.modules
from kungfu_tf.policy import BasePolicy, PolicyRunner


class Scripted(BasePolicy):
    """Runs ``action(ctx)`` after every step."""

    def __init__(self, action):
        self._action = action

    def config(self):
        return {}

    def after_step(self, ctx):
        self._action(ctx)


def run_steps(runner: PolicyRunner, steps: int) -> None:
    with runner.training():
        for _ in range(steps):
            with runner.step():
                pass  # no training work: the test checks the runner's bookkeeping afterwards


def read_events(log_dir: str) -> tuple[dict[str, list[tuple[int, float]]], list[tuple[int, str]]]:
    """(scalars by tag: [(step, value)], decision texts: [(step, text)]) from the event file."""
    scalars: dict[str, list[tuple[int, float]]] = {}
    texts: list[tuple[int, str]] = []
    (path,) = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            tensor = tf.make_ndarray(value.tensor)
            if value.metadata.plugin_data.plugin_name == "scalars":
                scalars.setdefault(value.tag, []).append((event.step, float(tensor)))
            elif value.tag == "policy/decisions":
                texts.append((event.step, tensor.item().decode()))
    return scalars, texts


def test_peers_self_peer_and_no_size_bounds_outside_an_elastic_job():
    seen = []
    runner = PolicyRunner([Scripted(lambda ctx: seen.append((ctx.peers, ctx.self_peer, ctx.size_bounds)))], verbose=False)
    run_steps(runner, 1)
    me = membership.self_peer()
    assert seen == [((me,), me, None)]
    assert me == os.environ.get("KUNGFU_SELF", me) and ":" in me


def test_size_bounds_come_from_the_elastic_job_state(monkeypatch):
    monkeypatch.setattr(em, "is_elastic", lambda: True)
    monkeypatch.setattr(em, "job_state", lambda: types.SimpleNamespace(min_size=2, max_size=3))
    assert PolicyRunner([], verbose=False).context.size_bounds == (2, 3)


def test_log_lines_are_printed_by_rank_0_kept_and_written_to_tensorboard_with_policy_scalars(tmp_path, capsys):
    def act(ctx):
        ctx.log(f"nothing to change at step {ctx.step}")
        ctx.metrics["scripted/fraction/127.0.0.1:41000"] = np.float64(0.25 * (ctx.step + 1))
        ctx.metrics["scripted/count"] = ctx.step + 1
        ctx.metrics["scripted/per_index"] = [1.0, 2.0]
        ctx.metrics["scripted/flag"] = True  # not a number: skipped

    runner = PolicyRunner([Scripted(act)], log_dir=str(tmp_path), verbose=True)
    run_steps(runner, 3)
    want = [f"step {s + 1}: nothing to change at step {s} [Scripted]" for s in range(3)]
    assert runner.log_lines == want
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[kungfu_tf.policy]")]
    assert printed == [f"[kungfu_tf.policy] {line}" for line in want]
    scalars, texts = read_events(str(tmp_path))
    assert texts == [(s + 1, line) for s, line in enumerate(want)]
    assert scalars["policy/scripted/fraction/127.0.0.1:41000"] == [(0, 0.25), (1, 0.5), (2, 0.75)]
    assert scalars["policy/scripted/count"] == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert scalars["policy/scripted/per_index/1"] == [(0, 2.0), (1, 2.0), (2, 2.0)]
    assert "policy/scripted/flag" not in scalars


def test_decisions_are_in_the_log_lines_too_and_a_quiet_runner_prints_nothing(capsys):
    def act(ctx):
        ctx.log("before")
        ctx.set_topology("RING", reason="test")

    runner = PolicyRunner([Scripted(act)], verbose=False)
    run_steps(runner, 1)
    assert len(runner.history) == 1 and runner.history[0].name == "topology"
    assert runner.log_lines == ["step 1: before [Scripted]", str(runner.history[0])]
    assert "[kungfu_tf.policy]" not in capsys.readouterr().out


def test_resize_to_workers_is_passed_to_ops_resize_and_recorded(monkeypatch):
    resize_module = sys.modules["kungfu_tf.ops.resize"]  # the package's 'resize' is the function

    calls = []

    def fake_resize(new_size=None, *, workers=None, wait=False, timeout=None):
        calls.append((new_size, workers))
        return tf.constant(True), tf.constant(False)

    monkeypatch.setattr(resize_module, "resize", fake_resize)
    me = membership.self_peer()
    runner = PolicyRunner([Scripted(lambda ctx: ctx.resize(workers=[me], reason="evict the straggler"))], verbose=False)

    def two_members():  # the runner reads the peers before each phase; pretend a second member
        runner.peers = ("10.0.0.9:40000", me)

    real_refresh = runner.refresh_cluster
    monkeypatch.setattr(runner, "refresh_cluster", lambda: (real_refresh(), two_members()))
    run_steps(runner, 1)
    assert calls == [(None, [me])]
    (decision,) = runner.history
    assert (decision.name, decision.old, decision.new, decision.reason, decision.refused) == (
        "workers", ["10.0.0.9:40000", me], [me], "evict the straggler", "")


def test_resize_to_the_current_members_changes_nothing(monkeypatch):
    resize_module = sys.modules["kungfu_tf.ops.resize"]  # the package's 'resize' is the function

    monkeypatch.setattr(resize_module, "resize", lambda *a, **k: pytest.fail("resize called for no change"))
    runner = PolicyRunner([Scripted(lambda ctx: ctx.resize(workers=list(ctx.peers)))], verbose=False)
    run_steps(runner, 2)
    assert runner.history == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "give exactly one of new_size and workers, got new_size=None, workers=None"),
        ({"new_size": 2, "workers": ["SELF"]}, ValueError, "give exactly one of new_size and workers, got new_size=2"),
        ({"workers": "SELF"}, TypeError, "workers must be a list of 'host:port' strings, got 'SELF'"),
        ({"workers": []}, ValueError, "workers must name at least one worker, got an empty list"),
        ({"workers": ["SELF", "SELF"]}, ValueError, r"workers\[1\] '[^']+' appears more than once"),
        ({"workers": [7]}, TypeError, r"workers\[0\] must be a 'host:port' string, got int 7"),
        ({"workers": ["10.1.1.1:1"]}, ValueError, r"workers\[0\] '10.1.1.1:1' is not a member of the cluster"),
        ({"new_size": 0}, ValueError, "new_size must be positive, got 0"),
        ({"new_size": 2.0}, TypeError, "new_size must be an int, got 2.0"),
    ],
)
def test_resize_rejects_bad_requests_naming_the_argument(kwargs, error, message):
    me = membership.self_peer()
    kwargs = {k: ([me if w == "SELF" else w for w in v] if isinstance(v, list) else v) for k, v in kwargs.items()}
    runner = PolicyRunner([Scripted(lambda ctx: ctx.resize(**kwargs))], verbose=False)
    with pytest.raises(error, match=message):
        run_steps(runner, 1)


def test_log_rejects_a_non_string():
    runner = PolicyRunner([Scripted(lambda ctx: ctx.log(3.5))], verbose=False)
    with pytest.raises(TypeError, match="log: text must be a str, got float 3.5"):
        run_steps(runner, 1)


def test_a_joiner_keeps_the_per_worker_batch_and_ends_with_the_members_state_dict(monkeypatch):
    """ElasticState syncs runner.state_dict() from members still sized for the old cluster (they refresh
    at their next phase); the joiner, already in the new one, must train on the same per-worker batch,
    and its state_dict must equal the members' (the sync compares digests)."""
    import kungfu_tf.policy.cluster_following as following  # where the runner reads rank and size

    members = PolicyRunner([], batch_size=8, verbose=False)  # one worker: local batch 8
    members.before_train()
    state = json.loads(json.dumps(members.state_dict()))
    joiner = PolicyRunner([], batch_size=8, verbose=False)
    joiner.before_train()
    three = types.SimpleNamespace(current_int=lambda op: op(), rank=lambda: 2, cluster_size=lambda: 3)
    monkeypatch.setattr(following, "config", three)  # the joiner is rank 2 of 3
    joiner.load_state_dict(state)
    assert (joiner.size, joiner.batch_size, int(joiner.local_batch_size.numpy())) == (3, 24, 8)
    assert joiner.state_dict() == members.state_dict()


def test_a_membership_change_is_seen_before_the_next_step_is_counted(monkeypatch):
    """Every worker must count the first step after a join with the new cluster's global batch (the elastic
    sync compares the runners' state_dicts): the runner follows applied versions, not only its next phase."""
    import kungfu_tf.policy.cluster_following as following  # where the runner reads rank and size

    listeners = []
    monkeypatch.setattr(em, "is_elastic", lambda: True)
    monkeypatch.setattr(em, "add_apply_listener", lambda f, first=False: listeners.append(f) or (lambda: None))
    runner = PolicyRunner([], batch_size=8, verbose=False)
    run_steps(runner, 1)
    assert runner.samples == 8 and len(listeners) == 1
    monkeypatch.setattr(following, "config", types.SimpleNamespace(
        current_int=lambda op: op(), rank=lambda: 0, cluster_size=lambda: 3))  # fmt: skip
    listeners[0](types.SimpleNamespace(detached=False))  # a version with 2 joiners applied at the step boundary
    with runner.step():
        pass  # no training work: the test checks the runner's bookkeeping afterwards
    assert (runner.size, runner.batch_size, runner.samples) == (3, 24, 8 + 24)


def test_a_worker_detached_by_a_resize_stops_fit_and_runs_no_more_policy_rounds(monkeypatch):
    """After a resize took this worker out (it left the cluster), Keras must stop at once and the runner
    must not run hooks or agreement rounds (its collectives would fail)."""
    import keras

    import kungfu_tf.keras as kfk

    resize_module = sys.modules["kungfu_tf.ops.resize"]
    monkeypatch.setattr(resize_module, "resize", lambda *a, **k: (tf.constant(False), tf.constant(True)))
    calls = []

    def act(ctx):
        calls.append(ctx.step)
        if ctx.step == 2:
            ctx.resize(2, reason="evicted")  # the fake says: this worker was detached

    class Batches(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = 0

        def on_train_batch_end(self, batch, logs=None):
            self.ends += 1

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    cb, batches = kfk.PolicyCallback([Scripted(act)], verbose=False), Batches()
    x = np.zeros((40, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=4, epochs=2, verbose=0, callbacks=[cb, batches])
    assert cb.runner.detached and calls == [0, 1, 2]
    assert batches.ends == 3, "fit went on after the worker was detached"


def test_a_worker_detached_by_a_resize_stops_a_v1_monitored_session(monkeypatch):
    from kungfu_tf.v1 import PolicyHook

    resize_module = sys.modules["kungfu_tf.ops.resize"]
    monkeypatch.setattr(resize_module, "resize", lambda *a, **k: (tf.constant(False), tf.constant(True)))
    calls = []

    def act(ctx):
        calls.append(ctx.step)
        if ctx.step == 1:
            ctx.resize(2, reason="evicted")

    with tf.Graph().as_default():
        hook = PolicyHook([Scripted(act)], verbose=False)
        step = tf.compat.v1.train.get_or_create_global_step().assign_add(1)
        ran = 0
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
            while not sess.should_stop() and ran < 10:
                sess.run(step)
                ran += 1
    assert hook.runner.detached and calls == [0, 1] and ran == 2


def test_asking_for_the_current_size_cancels_a_pending_growth(monkeypatch):
    """A policy that settles while its growth is pending asks for the current size: the runner must pass
    it to kungfu_tf.ops.resize (which lowers the job's target), or joiners arriving later grow the
    cluster past the settled size. Before the fix the runner dropped a request equal to the size."""
    resize_module = sys.modules["kungfu_tf.ops.resize"]
    calls = []

    def fake_resize(new_size=None, *, workers=None, wait=False, timeout=None):
        calls.append(new_size)
        return tf.constant(False), tf.constant(False)  # a growth stays pending; a cancel changes nothing

    monkeypatch.setattr(resize_module, "resize", fake_resize)
    asks = {0: 3, 2: 1, 4: 1}  # step -> size asked; this one-worker runner has size 1
    runner = PolicyRunner([Scripted(lambda ctx: ctx.resize(asks[ctx.step]) if ctx.step in asks else None)],
                          verbose=False)
    run_steps(runner, 6)
    # Step 0 asks to grow (pending), step 2 cancels it, step 4 asks for the size it has: nothing to do.
    assert calls == [3, 1]
    grow, cancel = runner.history
    assert (grow.old, grow.new, grow.refused) == (1, 3, "pending: joiners are warming up")
    assert (cancel.old, cancel.new, cancel.refused) == (1, 1, "")
    assert cancel.reason.endswith("cancels the pending growth to 3")
    assert str(grow) == "step 1: size 1 -> 3 pending: joiners are warming up [Scripted]"  # not "refused"


def test_before_train_again_after_a_membership_change_keeps_the_new_clusters_batch(monkeypatch):
    """elastic.run calls the training function again after a recovery, and it enters runner.training()
    again: the runner must keep the batch of the cluster it now has, not re-adopt the global batch saved
    in its state before the change (a member then trained on 8 rows at 2 workers where a joiner,
    synced with the per-worker batch, trained on 16: the next state sync failed)."""
    import kungfu_tf.policy.cluster_following as following  # where the runner reads rank and size

    listeners = []
    monkeypatch.setattr(em, "is_elastic", lambda: True)
    monkeypatch.setattr(em, "add_apply_listener", lambda f, first=False: listeners.append(f) or (lambda: None))
    runner = PolicyRunner([], batch_size=16, verbose=False)  # one worker: local batch 16
    run_steps(runner, 2)
    monkeypatch.setattr(following, "config", types.SimpleNamespace(
        current_int=lambda op: op(), rank=lambda: 0, cluster_size=lambda: 2, topology=following.config.topology))  # fmt: skip
    listeners[0](types.SimpleNamespace(detached=False))  # a joiner admitted; recovery restarts the function
    run_steps(runner, 1)
    assert (runner.size, runner.batch_size, int(runner.local_batch_size.numpy())) == (2, 32, 16)
    assert (runner.steps_done, runner.samples) == (3, 16 + 16 + 32)
