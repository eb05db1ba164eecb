"""The decision log: every applied or refused change (:class:`Decision`) and the policies' own lines.

Kept on every worker (``runner.history``, ``runner.log_lines``), printed by
rank 0 when the runner is verbose, and written by rank 0 to its TensorBoard
event file (text ``policy/decisions``, and the metrics as scalars). A write
that fails is not raised where it happens (only rank 0 writes, so only rank
0 would stop): it is kept, and the runner's next logging round reports it
on every worker.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kungfu_tf.policy.summary_log import SummaryLog

PENDING = "pending"  # Decision.refused of a growth that waits for the launcher's joiners


@dataclass(frozen=True)
class Decision:
    """One applied or refused request: at ``step`` (steps completed), ``name`` went ``old`` -> ``new``."""

    step: int
    name: str
    old: Any
    new: Any
    requested_by: str
    reason: str = ""
    refused: str = ""  # why it was refused, or "pending: ..." (a growth waiting for joiners); "" if applied

    def __str__(self) -> str:
        """The log line; floats rounded to 6 significant digits (the record keeps them whole).

        Example:
            >>> str(Decision(40, "learning_rate", 0.019999999552965164, 0.0314426489442281, "lr_rule=adascale"))
            'step 40: learning_rate 0.02 -> 0.0314426 [lr_rule=adascale]'
        """
        why = f" ({self.reason})" if self.reason else ""
        change = f"{self.name} {_shown(self.old)} -> {_shown(self.new)}"
        if self.refused.startswith(PENDING):  # not refused: applied when the joiners are admitted
            return f"step {self.step}: {change} {self.refused} [{self.requested_by}{why}]"
        if self.refused:
            return f"step {self.step}: {change} refused: {self.refused} [{self.requested_by}{why}]"
        return f"step {self.step}: {change} [{self.requested_by}{why}]"


def _shown(value: Any) -> str:
    # A float32 learning rate read back as a float prints as 0.019999999552965164.
    return f"{value:.6g}" if isinstance(value, float) else str(value)


class DecisionLog:
    """``history`` (the :class:`Decision` records) and ``log_lines`` (their text and ``ctx.log`` lines), in order.

    ``logging``: whether rank 0 writes a TensorBoard log (every worker holds
    the same answer, agreed when the runner starts), which decides the
    runner's logging rounds.
    """

    def __init__(self, log_dir: str | None):
        self.log_dir = log_dir
        self.history: list[Decision] = []
        self.log_lines: list[str] = []
        self.logging = False
        self._summary: SummaryLog | None = None
        self._write_failure: tuple[str, BaseException] | None = None

    @property
    def writes(self) -> bool:
        """Whether this worker writes the TensorBoard log now (rank 0, until a write fails)."""
        return self._summary is not None

    def open(self, rank: int, failure: tuple[str, BaseException] | None) -> tuple[str, BaseException] | None:
        """Rank 0 creates the event file (unless the checks before failed); returns the failure to report."""
        if failure is None and self.log_dir is not None and rank == 0:
            try:
                self._summary = SummaryLog(self.log_dir)
            except Exception as e:  # noqa: BLE001 -- every worker must learn of it
                failure = ("TensorBoard log", OSError(
                    f"log_dir={self.log_dir!r}: cannot create the TensorBoard event file: {type(e).__name__}: {e}"))  # fmt: skip
        return failure

    def decide(self, decision: Decision, echo: bool) -> None:
        self.history.append(decision)
        self.add(decision.step, str(decision), echo)

    def add(self, step: int, line: str, echo: bool) -> None:
        """Adds ``line``; ``echo``: print it too."""
        self.log_lines.append(line)
        if echo:
            print(f"[kungfu_tf.policy] {line}", flush=True)
        if self._summary is not None:
            try:
                self._summary.text(step, "decisions", line)
            except Exception as e:  # noqa: BLE001 -- reported at the next logging round, on every worker
                self._write_failed(e)

    def scalars(self, step: int, read: Callable[[], dict[str, Any]]) -> None:
        """Rank 0 writes the values ``read()`` returns as TensorBoard scalars (a failure of either is reported)."""
        if self._summary is None:
            return
        try:
            self._summary.scalars(step, read())
        except Exception as e:  # noqa: BLE001 -- every worker must learn of it
            self._write_failed(e)

    def policy_scalars(self, step: int, metrics: dict[str, Any]) -> None:
        """Rank 0 writes the numbers the policies put under "<policy>/<name>" as TensorBoard scalars."""
        values = {k: v for k, v in metrics.items() if "/" in k}
        if values:
            self.scalars(step, lambda: values)

    def flush(self) -> None:
        if self._summary is None:
            return
        try:
            self._summary.flush()
        except Exception as e:  # noqa: BLE001 -- every worker must learn of it
            self._write_failed(e)

    def take_failure(self) -> tuple[str, BaseException] | None:
        """The write failure not reported yet (then forgotten), or None."""
        failure, self._write_failure = self._write_failure, None
        return failure

    @property
    def failed(self) -> bool:
        return self._write_failure is not None

    def _write_failed(self, error: BaseException) -> None:
        self._summary = None  # no further writes; the next round reports it everywhere
        if self._write_failure is None:
            self._write_failure = ("TensorBoard log", OSError(
                f"log_dir={self.log_dir!r}: writing the TensorBoard events failed: {type(error).__name__}: {error}"))  # fmt: skip
