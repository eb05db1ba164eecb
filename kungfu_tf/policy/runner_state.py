"""The policies' part of the runner's checkpoint and elastic state: each policy's ``state_dict()``.

The counters (steps, samples, epoch, batch) change every step and are one
small assign; the policies' JSON is serialized only after a phase in which
some policy ran, and written only when it changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kungfu_tf.policy.base_policy import BasePolicy


class PolicyStates:
    """Saves, restores and hands over the ``state_dict()`` of each policy of a runner, in order."""

    def __init__(self, policies: Sequence[BasePolicy]):
        self.policies = list(policies)
        self.ran = True  # a policy ran since the last save (write the policies' initial state at the first)
        self._json: str | None = None  # as last written

    def check_classes(self, saved: list[dict[str, Any]]) -> None:
        """Checks that the entries of a restored checkpoint are for these policies.

        Raises:
            ValueError: they are for another list of policies.
        """
        classes = [type(p).__qualname__ for p in self.policies]
        saved_classes = [entry.get("class") for entry in saved]
        if saved_classes != classes:
            raise ValueError(
                f"the restored policy state is for policies {saved_classes}, but this runner has {classes}: "
                "restore a checkpoint of the same policy list"
            )

    def adopt(self, saved: list[dict[str, Any]]) -> None:
        """Loads the entries of a restored checkpoint (checked with :meth:`check_classes`)."""
        for policy, entry in zip(self.policies, saved):
            policy.load_state_dict(entry.get("state", {}))
        self._json = json.dumps(saved, sort_keys=True)

    def state_dicts(self) -> list[dict[str, Any]]:
        return [p.state_dict() for p in self.policies]

    def load(self, states: list[dict[str, Any]]) -> None:
        """Loads another worker's :meth:`state_dicts` (an elastic sync).

        Raises:
            ValueError: the state has another number of policies.
        """
        if len(states) != len(self.policies):
            raise ValueError(
                f"PolicyRunner.load_state_dict: the state holds {len(states)} policies' states, this runner has "
                f"{len(self.policies)} policies ({', '.join(type(p).__name__ for p in self.policies)})"
            )
        for policy, entry in zip(self.policies, states):
            policy.load_state_dict(entry)
        self.ran = True

    def save(self, state: Any, counters: dict[str, int]) -> None:
        """Writes ``counters`` and, when changed since, the policies' states to ``state`` (a ``PolicyState``, or the v1 hook's)."""
        text = None
        if self.ran:
            self.ran = False
            entries = [{"class": type(p).__qualname__, "state": p.state_dict()} for p in self.policies]
            text = json.dumps(entries, sort_keys=True)
            if text == self._json:
                text = None
            else:
                self._json = text
        state.write(counters, text)
