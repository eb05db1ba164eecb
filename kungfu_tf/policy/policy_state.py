"""``PolicyState``: a policy runner's state in checkpoints.

A resumed run must continue with the batch size, counters and policy
references it had, not the constructor's: the learning rate (in the
optimizer) is restored by the checkpoint, and a batch size that did not
follow would break the pair the ``lr_rule`` keeps. Add the state to your
checkpoint; the runner adopts restored values in ``before_train``.

The values live in Python and are serialized (JSON) only when a checkpoint
is written (``tf.train.experimental.PythonState``), so keeping them costs
no op per step. The v1 ``PolicyHook`` keeps them in graph variables instead
(a ``Saver`` saves variables only).

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.policy import PolicyRunner
    >>> runner = PolicyRunner([], batch_size=64)
    >>> ckpt = tf.train.Checkpoint(policy=runner.state)   # with model=..., optimizer=...
    >>> runner.state.read()[0]["steps_done"]
    0
"""

from __future__ import annotations

import json
from typing import Any

import tensorflow as tf

# The counters a state holds. ``last_batch_change`` is -1 while the batch
# never changed; ``batch_size`` 0 when the runner does not control it.
COUNTERS = ("steps_done", "samples", "epoch", "batch_size", "last_batch_change")


class PolicyState(tf.train.experimental.PythonState):
    """The counters (see :data:`COUNTERS`) and each policy's ``state_dict()``, saved by
    ``tf.train.Checkpoint`` as one JSON string, serialized when the checkpoint is written.

    A state with ``steps_done > 0`` (restored, or carried over from an
    earlier ``fit`` of the same runner) is adopted by ``before_train``.
    """

    def __init__(self) -> None:
        # A plain trackable (not a tf.Module): attributes are not wrapped, and
        # updating them every step costs no more than a dict assignment.
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._counters["last_batch_change"] = -1
        self._policies = "[]"

    def serialize(self) -> str:
        return self.to_json()

    def deserialize(self, string_value: Any) -> None:
        text = string_value.decode("utf-8") if isinstance(string_value, bytes) else str(string_value)
        self.load_json(text)

    def read(self) -> tuple[dict[str, int], list[dict[str, Any]]]:
        """The counters by name and the policies' states."""
        return dict(self._counters), json.loads(self._policies)

    def write(self, counters: dict[str, int], policies_json: str | None = None) -> None:
        """Keeps the counters (and the policies' JSON, if given) for the next checkpoint."""
        self._counters = counters
        if policies_json is not None:
            self._policies = policies_json

    def to_json(self) -> str:
        return json.dumps({"counters": self._counters, "policies": json.loads(self._policies)}, sort_keys=True)

    def load_json(self, text: str) -> None:
        data = json.loads(text)
        missing = [name for name in COUNTERS if name not in data.get("counters", {})]
        if missing:
            raise ValueError(f"the checkpointed policy state lacks the counters {missing}: {text[:200]!r}")
        self._counters = {name: int(data["counters"][name]) for name in COUNTERS}
        self._policies = json.dumps(data.get("policies", []), sort_keys=True)
