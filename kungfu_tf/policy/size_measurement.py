"""``SizeMeasurement``: which steps measure the throughput of the current cluster size (no TF).

A size is measured over ``steps`` steps once it has been seen; the step at
which a new size is first seen is never counted (its throughput was
computed with the old global batch, and it included the new members' state
sync), nor are the ``warmup_steps`` after it. A requested growth is
asynchronous (the joiners warm up on their own): until the cluster has
changed, steps run at the old size and are not counted for anything; after
``grow_timeout_steps`` without a change the growth is given up.

Every field except the local sums depends only on step numbers and sizes,
which all workers share, so all workers reach the same events at the same
step; the sums are this worker's and are agreed (all-reduced) by the policy.

Example:
    >>> m = SizeMeasurement(steps=2, warmup_steps=1, grow_timeout_steps=5)
    >>> [m.observe(step, 2, 100.0 + step) for step in range(4)]
    ['resized', 'warmup', 'measuring', 'ready']
    >>> m.take()   # steps 2 and 3
    (205.0, 2)
"""

from __future__ import annotations

from typing import Any

RESIZED, WARMUP, WAITING, TIMEOUT, MEASURING, READY, NO_METRIC = (
    "resized", "warmup", "waiting", "timeout", "measuring", "ready", "no_metric")  # fmt: skip


def positive_int(owner: str, name: str, value: Any, minimum: int = 1) -> int:
    """``value`` if it is an int >= ``minimum``; else a ValueError naming ``owner``, ``name`` and the value."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        what = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise ValueError(f"{owner}: {name} must be {what}, got {value!r}")
    return value


class SizeMeasurement:
    """The measurement window of the current size and a pending growth.

    ``observe(step, size, throughput)`` after every step returns one of:
    ``"resized"`` (a new size was seen: a new window starts),
    ``"warmup"``, ``"waiting"`` (a growth is pending), ``"timeout"`` (the
    pending growth took too long: given up), ``"no_metric"`` (a counted step
    without a throughput), ``"measuring"`` or ``"ready"`` (the window is
    full: agree on :meth:`take` and decide).
    """

    def __init__(self, steps: int, warmup_steps: int, grow_timeout_steps: int, owner: str = "SizeMeasurement",
                 steps_name: str = "steps"):  # fmt: skip
        self.steps = positive_int(owner, steps_name, steps)
        self.warmup_steps = positive_int(owner, "warmup_steps", warmup_steps, minimum=0)
        self.grow_timeout_steps = positive_int(owner, "grow_timeout_steps", grow_timeout_steps)
        self.size: int | None = None
        self.measure_from = 0
        self.pending: int | None = None  # the size a growth asked for
        self.asked_at = 0
        self.previous_size: int | None = None
        self.reached_pending: bool = False
        self._total = 0.0
        self._count = 0

    def observe(self, step: int, size: int, throughput: float | None) -> str:
        if size != self.size:
            self.previous_size, self.size = self.size, size
            self.reached_pending = self.pending is not None and size == self.pending
            self.pending = None
            self.measure_from = step + 1 + self.warmup_steps
            self._total, self._count = 0.0, 0
            return RESIZED
        if self.pending is not None:
            if step - self.asked_at >= self.grow_timeout_steps:
                return TIMEOUT
            return WAITING
        if step < self.measure_from:
            return WARMUP
        if throughput is None:
            return NO_METRIC
        self._total += float(throughput)
        self._count += 1
        return READY if step >= self.measure_from + self.steps - 1 else MEASURING

    def ask_growth(self, target: int, step: int) -> None:
        """A growth to ``target`` was requested after ``step``: wait for it (steps not counted)."""
        self.pending, self.asked_at = target, step

    def take(self) -> tuple[float, int]:
        """This worker's (sum of throughputs, steps) of the window, and a fresh window at the same size."""
        out = (self._total, self._count)
        self._total, self._count = 0.0, 0
        return out

    def restart(self, step: int) -> None:
        """Measures the current size again from the step after ``step`` (no warm-up)."""
        self.measure_from = step + 1
        self._total, self._count = 0.0, 0

    def state_dict(self) -> dict[str, Any]:
        # The local sums stay local: each worker's own, agreed at the decision.
        return {"size": self.size, "measure_from": self.measure_from, "pending": self.pending, "asked_at": self.asked_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.size = state.get("size")
        self.measure_from = int(state.get("measure_from", 0))
        self.pending = state.get("pending")
        self.asked_at = int(state.get("asked_at", 0))
        self._total, self._count = 0.0, 0
