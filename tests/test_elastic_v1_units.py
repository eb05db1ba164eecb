"""ElasticHook / ElasticSessionCreator in one process: a step that fails with UnavailableError (what a lost
peer gives) makes MonitoredSession create a new session. With ElasticSessionCreator it is the same session,
so the variables survive and the hook runs the recovery; the failed step runs again with a fresh feed. The
result equals a numpy reference of the same SGD steps. Without it (the stock creator) the variables start
over: the limit this creator removes. The elastic runtime is replaced by a scripted stand-in here; the real
multi-worker crash is in tests/test_elastic_v1.py.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf.data import ElasticSampler
from kungfu_tf.v1 import ElasticHook, ElasticSessionCreator, session_variables

SAMPLES, BATCH, LR = 24, 4, 0.1


class ScriptedState:
    def __init__(self, variables, sampler):
        self._variables, self.sampler = variables, sampler
        self.step, self.epoch = 0, 0
        self.syncs, self.recovered = 0, []

    def variables(self):
        return self._variables

    def sync(self):
        self.syncs += 1

    def commit(self):
        self.step += 1

    def check(self):
        return None


@pytest.fixture
def scripted_runtime(monkeypatch):
    """A stand-in for kungfu_tf.elastic.recover (this is no elastic job: nothing to report or wait for)."""
    import kungfu_tf.elastic

    recoveries = []

    def recover(state, error):
        recoveries.append((state.step, [v.numpy().copy() for v in state.variables()]))
        return types.SimpleNamespace(detached=False)

    monkeypatch.setattr(kungfu_tf.elastic, "recover", recover)
    return recoveries


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(SAMPLES, 3)).astype(np.float32), rng.normal(size=(SAMPLES, 1)).astype(np.float32)


class FlakySession:
    """A session whose ``creator.fail_at``-th training run (counted over all sessions of the creator) fails,
    before running anything, with UnavailableError."""

    def __init__(self, session, creator):
        self._session, self._creator = session, creator

    def run(self, fetches, feed_dict=None, **kwargs):
        if feed_dict and any(getattr(k, "name", "").startswith("features") for k in feed_dict):
            self._creator.training_runs += 1
            if self._creator.training_runs == self._creator.fail_at:
                raise tf.errors.UnavailableError(None, None, "peer 127.0.0.1:10001 lost (scripted)")
        return self._session.run(fetches, feed_dict=feed_dict, **kwargs)

    def __getattr__(self, name):
        return getattr(self._session, name)


class FlakyCreator(tf.compat.v1.train.SessionCreator):
    def __init__(self, inner, fail_at):
        self.inner, self.fail_at, self.training_runs = inner, fail_at, 0

    def create_session(self):
        return FlakySession(self.inner.create_session(), self)


def train(creator, epochs: int = 2):
    """Linear regression with plain SGD, under ``MonitoredSession(creator)``."""
    x, y = data()
    with tf.Graph().as_default():
        x_in = tf.compat.v1.placeholder(tf.float32, [None, 3], name="features")
        y_in = tf.compat.v1.placeholder(tf.float32, [None, 1])
        w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.constant_initializer(0.5))
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_mean(tf.square(tf.matmul(x_in, w) - y_in))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(LR).minimize(loss, global_step=step)
        sampler = ElasticSampler(SAMPLES, BATCH, seed=5)
        state = ScriptedState(session_variables(tf.compat.v1.global_variables()), sampler)
        hook = ElasticHook(state, sampler, feed=lambda ids: {x_in: x[ids], y_in: y[ids]})
        with tf.compat.v1.train.MonitoredSession(session_creator=creator, hooks=[hook]) as sess:
            while state.epoch < epochs:
                sess.run(train_op)
            # Read past the hooks: every sess.run through them is a training step.
            w_value, step_value = sess.run_step_fn(lambda step_context: step_context.session.run([w, step]))
            return w_value, int(step_value), state, hook


def reference(epochs: int = 2):
    x, y = data()
    sampler, w = ElasticSampler(SAMPLES, BATCH, seed=5), np.full([3, 1], 0.5, np.float64)
    for e in range(epochs):
        for ids in np.split(sampler.order(e), SAMPLES // BATCH):
            grad = 2 * x[ids].T.astype(np.float64) @ (x[ids] @ w - y[ids]) / len(ids)
            w -= LR * grad
    return w


def test_a_lost_peer_keeps_the_session_recovers_and_runs_the_step_again(scripted_runtime):
    creator = ElasticSessionCreator(session_creator=FlakyCreator(tf.compat.v1.train.ChiefSessionCreator(), fail_at=4))
    w, global_step, state, hook = train(creator)
    assert creator.sessions_created == 2 and hook.recoveries == 1
    assert state.syncs == 1  # the first session; the recovery's sync is recover()'s
    (recovered_step, values), = scripted_runtime
    assert recovered_step == 3  # three steps committed before the failed one
    assert int(values[1]) == 3  # the global step in the kept session: nothing was re-initialized
    assert global_step == state.step == 2 * SAMPLES // BATCH
    np.testing.assert_allclose(w, reference(), rtol=1e-5)


def test_the_stock_session_creator_loses_the_state(scripted_runtime):
    # What the kept session avoids: MonitoredSession's recovery initializes every variable again.
    w, global_step, state, _ = train(FlakyCreator(tf.compat.v1.train.ChiefSessionCreator(), fail_at=4))
    assert state.step == 2 * SAMPLES // BATCH and global_step == state.step - 3
    assert not np.allclose(w, reference(), rtol=1e-3)


def test_state_variables_must_be_session_variables():
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", [1])
        hook = ElasticHook(ScriptedState([v], None))
        with pytest.raises(TypeError, match=r"variables\[0\] \('v:0'\) is not a SessionVariable"):
            hook.begin()
    with pytest.raises(TypeError, match="give both sampler= and feed="):
        ElasticHook(ScriptedState([], None), sampler=ElasticSampler(4, 1))
