"""``Hysteresis``: which batch-size requests the runner refuses, so that the batch does not oscillate.

AdaptDL's batch size oscillated until a threshold was added; here a request
is refused when it comes too soon after the last change or changes too
little. Both rules depend only on agreed values (the step counter, the old
and new size), so every worker decides alike.

Example:
    >>> from kungfu_tf.policy.hysteresis import Hysteresis
    >>> h = Hysteresis(min_dwell_steps=10, min_relative_change=0.2)
    >>> h.refusal(step=5, last_change_step=0, old=64, new=128)
    'only 5 steps since the last change at step 0 (min_dwell_steps=10)'
    >>> h.refusal(step=20, last_change_step=0, old=64, new=72) is not None  # +12.5 %
    True
    >>> h.refusal(step=20, last_change_step=0, old=64, new=128) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hysteresis:
    """``min_dwell_steps``: steps a batch size is kept at least; ``min_relative_change``:
    smallest accepted ``|new - old| / old``."""

    min_dwell_steps: int = 0
    min_relative_change: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.min_dwell_steps, bool) or not isinstance(self.min_dwell_steps, int) or self.min_dwell_steps < 0:
            raise ValueError(f"min_dwell_steps must be an int >= 0, got {self.min_dwell_steps!r}")
        if not isinstance(self.min_relative_change, (int, float)) or not 0 <= self.min_relative_change:
            raise ValueError(f"min_relative_change must be a number >= 0, got {self.min_relative_change!r}")

    def refusal(self, step: int, last_change_step: int | None, old: int, new: int) -> str | None:
        """Why changing the batch from ``old`` to ``new`` at ``step`` is refused, or None to accept it."""
        if last_change_step is not None and step - last_change_step < self.min_dwell_steps:
            return (
                f"only {step - last_change_step} steps since the last change at step {last_change_step} "
                f"(min_dwell_steps={self.min_dwell_steps})"
            )
        change = abs(new - old) / old
        if change < self.min_relative_change:
            return f"relative change {change:.3g} < min_relative_change={self.min_relative_change}"
        return None
