"""``PolicyState``: a policy runner's state as variables, so that checkpoints carry it.

A resumed run must continue with the batch size, counters and policy
references it had, not the constructor's: the learning rate (in the
optimizer) is restored by the checkpoint, and a batch size that did not
follow would break the pair the ``lr_rule`` keeps. Add the state to your
checkpoint; the runner adopts restored values in ``before_train``.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.policy import PolicyRunner
    >>> from kungfu_tf.policy.policy_state import COUNTERS
    >>> runner = PolicyRunner([], batch_size=64)
    >>> ckpt = tf.train.Checkpoint(policy=runner.state)   # with model=..., optimizer=...
    >>> int(runner.state.counters[COUNTERS.index("steps_done")])
    0
"""

from __future__ import annotations

import json
from typing import Any

import tensorflow as tf

# The int64 counters, by position in ``PolicyState.counters``.
# ``last_batch_change`` is -1 while the batch never changed; ``batch_size`` 0
# when the runner does not control it.
COUNTERS = ("steps_done", "samples", "epoch", "batch_size", "last_batch_change")


class PolicyState(tf.Module):
    """``counters`` (int64, see :data:`COUNTERS`) and ``policies`` (a JSON list of each
    policy's ``state_dict()``, a tf.string), saved by ``tf.train.Checkpoint``.

    A state with ``steps_done > 0`` counts as restored (or carried over from
    an earlier ``fit`` of the same runner): ``before_train`` adopts it.
    """

    def __init__(self, name: str = "kungfu_policy_state"):
        super().__init__(name=name)
        with tf.init_scope():
            self.counters = tf.Variable(tf.zeros([len(COUNTERS)], tf.int64), trainable=False, name="counters")
            self.policies = tf.Variable("[]", dtype=tf.string, trainable=False, name="policies")

    def read(self) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """The counters by name and the policies' states, eagerly."""
        with tf.init_scope():
            values = [int(v) for v in self.counters.numpy()]
            policies = json.loads(self.policies.numpy().decode("utf-8"))
        return dict(zip(COUNTERS, values)), policies

    def write(self, counters: dict[str, int], policies_json: str | None = None) -> None:
        """Assigns the counters (and the policies' JSON, if given), eagerly."""
        with tf.init_scope():
            self.counters.assign([int(counters[name]) for name in COUNTERS])
            if policies_json is not None:
                self.policies.assign(policies_json)
