"""Trials: a candidate strategy measured by real training steps on the job's workers.

AutoDist §2.4 launches a short run of each elite candidate (§3.3: warm-up
iterations, then timed iterations) and feeds the measured time back to its
simulator. Here a trial runs *in the training processes*: switch every worker
to the candidate, run ``warmup`` steps (re-tracing, first-touch allocations),
then ``trial_steps`` timed steps. They are real training steps: every
strategy the search may choose is synchronous SGD, so the model trains
exactly as it would under any other.

Every decision a worker takes alone would split the job, so each one is
agreed:

* the candidate: consensus on its canonical bytes (the sampler is
  deterministic, but a worker built with other options would differ);
* failure: a trial that raised on any worker (a ``StrategyError`` while
  switching, an error in the step's trace or run, out of memory) is failed on
  every worker, by an all-reduce of a failure flag after the switch and after
  every step; it scores as infinitely slow and the search goes on;
* the measurement: the slowest worker's time per step (all-reduce max), since
  a synchronous step is as slow as its slowest worker.

The clock covers only the steps themselves, not the agreement between them.

A candidate's new collectives are new size classes for the runtime's AUTO
topology, which probes them during the steps after the switch; such steps
can take several times what the candidate will (measured on two emulated
hosts: PartitionedAR's trials took 1.5 and 2.3 s per step, its timed steps
0.99 s). So, with ``probe_wait_steps``, timing starts only after a step in
which no worker's probe took a sample (:func:`kungfu_tf.ops.auto_probe_samples`,
agreed), at most that many steps after the warm-up; the steps waited train
as any other. The rule is StrategyPolicy's (kungfu_tf/policy/strategy_policy.py).

Example:
    >>> from kungfu_tf.proto import strategy_pb2
    >>> steps = []
    >>> runner = TrialRunner(switch=lambda s: None, step=lambda: steps.append(1), warmup=1, trial_steps=2)
    >>> result = runner.run(0, strategy_pb2.Strategy(id="all-reduce"))
    >>> len(steps), result.failed, result.seconds_per_step >= 0
    (3, False, True)
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import auto_probe_samples, collective
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes

log = logging.getLogger("kungfu_tf.strategy.auto")

SwitchFn = Callable[[strategy_pb2.Strategy], None]


@dataclass(frozen=True)
class TrialResult:
    """What one trial measured, the same on every worker.

    ``seconds_per_step`` is the slowest worker's mean time of the timed steps
    (``math.inf`` if the trial failed); ``wall_seconds`` the whole trial
    (switch and warm-up included, slowest worker), which is what the search
    budget spends; ``error`` this worker's error, or a note that another
    worker failed.

    Example:
        >>> TrialResult(0, "ps", math.inf, 1.5, "StrategyError: ...").failed
        True
    """

    index: int
    strategy_id: str
    seconds_per_step: float
    wall_seconds: float
    error: str | None = None
    waited_steps: int = 0  # untimed steps after the warm-up while AUTO probed

    @property
    def failed(self) -> bool:
        """True if any worker failed this trial."""
        return math.isinf(self.seconds_per_step)


def agree_on_candidate(strategy: strategy_pb2.Strategy, name: str) -> None:
    """``StrategyError`` on every worker unless all of them hold this exact candidate."""
    data = np.frombuffer(canonical_bytes(strategy) or b"\0", dtype=np.uint8)
    if not bool(collective.consensus(tf.constant(data), name=f"{name}/candidate")):
        raise StrategyError(
            f"the workers do not hold the same trial candidate ({name}, id {strategy.id!r} here): the search "
            "must be given the same model, cluster, seed and options on every worker"
        )


def agree_any(flag: bool, name: str, topology: str | None = None) -> bool:
    """True on every worker iff ``flag`` is true on at least one (``topology`` as in ``all_reduce``)."""
    return bool(int(collective.all_reduce(tf.constant(int(flag), tf.int32), op="max", name=name, topology=topology)))


def agree_max(value: float, name: str) -> float:
    """The largest ``value`` of all workers, on every worker."""
    return float(collective.all_reduce(tf.constant(value, tf.float64), op="max", name=name))


def describe_error(error: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


class Trial:
    """One candidate's trial, advanced one training step at a time by whoever runs the steps.

    The search's own runner (:class:`TrialRunner`) calls :meth:`run_step` in a
    loop; ``builders.Auto`` calls it from the user's training loop, one call
    per step, so the trial trains on the user's batches.

    Example:
        >>> from kungfu_tf.proto import strategy_pb2
        >>> trial = Trial(0, strategy_pb2.Strategy(id="s"), warmup=0, trial_steps=1)
        >>> trial.begin(lambda s: None)
        >>> ok, out = trial.run_step(lambda: 42)
        >>> ok, out, trial.done
        (True, 42, True)
    """

    def __init__(
        self,
        index: int,
        candidate: strategy_pb2.Strategy,
        warmup: int,
        trial_steps: int,
        probe_wait_steps: int = 0,
        probe_samples: Callable[[], int] | None = None,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0 steps, got {warmup}")
        if trial_steps < 1:
            raise ValueError(f"trial_steps must be >= 1, got {trial_steps}")
        if probe_wait_steps < 0:
            raise ValueError(f"probe_wait_steps must be >= 0, got {probe_wait_steps}")
        self.index = index
        self.candidate = candidate
        self.warmup = warmup
        self.trial_steps = trial_steps
        self.name = f"kungfu/auto/trial/{index}"
        self.steps_run = 0
        self.timed_steps = 0
        self.waited_steps = 0  # steps after the warm-up not timed: AUTO was probing
        self.failed = False
        self.error: str | None = None
        self._timed = 0.0
        self._started = 0.0
        self._probe_wait = probe_wait_steps
        self._probe_samples = probe_samples or (lambda: int(auto_probe_samples()))
        self._timing = warmup == 0

    @property
    def done(self) -> bool:
        """True once the trial failed or timed all its steps."""
        return self.failed or self.timed_steps >= self.trial_steps

    def begin(self, switch: SwitchFn) -> None:
        """Checks that every worker holds this candidate, then switches every worker to it.

        A failed switch fails the trial on every worker (``failed``), not the job.
        """
        self._started = time.monotonic()
        agree_on_candidate(self.candidate, self.name)
        try:
            switch(self.candidate)
        except Exception as e:  # noqa: BLE001 -- any failure of one candidate is its score, not the job's end
            self._note_error(e, "switch")
        self._agree_failure("switch")

    def run_step(self, step: Callable[[], Any]) -> tuple[bool, Any]:
        """Runs one training step of the trial: ``(True, step's result)``, or ``(False, None)`` if it failed.

        A step that failed on any worker fails the trial on all of them.
        """
        if self.done:
            raise RuntimeError(f"trial {self.index} is over ({self.steps_run} steps run)")
        out = None
        timing = self._timing
        samples_before = self._probe_samples() if not timing and self.waited_steps < self._probe_wait else 0
        started = time.monotonic()
        try:
            out = step()
        except tf.errors.OutOfRangeError:
            # The end of the input (Keras fit ends an epoch of unknown length so), the same step on every
            # worker of an evenly sharded job: no failure of the candidate, and no step of the trial.
            raise
        except Exception as e:  # noqa: BLE001 -- scored as infinitely slow (module docstring)
            self._note_error(e, f"step {self.steps_run}")
        elapsed = time.monotonic() - started
        if self._agree_failure(f"step{self.steps_run}"):
            return False, None
        self.steps_run += 1
        if timing:
            self._timed += elapsed
            self.timed_steps += 1
        elif self.steps_run >= self.warmup:
            if self.steps_run > self.warmup:
                self.waited_steps += 1
            self._timing = self.waited_steps >= self._probe_wait or not self._probed_since(samples_before)
            if not self._timing and self.waited_steps + 1 == self._probe_wait:
                log.info("kungfu auto: trial %d (%s): AUTO still probing after %d steps of waiting; timing after one more",
                         self.index, self.candidate.id, self.waited_steps)  # fmt: skip
        return True, out

    def _probed_since(self, samples_before: int) -> bool:
        """True (agreed) if AUTO took a probe sample on some worker during the last step."""
        grew = self._probe_samples() != samples_before
        # On a fixed topology: under AUTO this call's own size class would be probed.
        return agree_any(grew, f"{self.name}/probing/{self.steps_run}", topology="STAR")

    def result(self) -> TrialResult:
        """The agreed measurement (collective: every worker calls it once the trial is ``done``)."""
        if not self.done:
            raise RuntimeError(f"trial {self.index} has timed {self.timed_steps} of {self.trial_steps} steps")
        wall = agree_max(time.monotonic() - self._started, f"{self.name}/wall")
        if self.failed:
            return TrialResult(self.index, self.candidate.id, math.inf, wall, self.error)
        per_step = agree_max(self._timed / self.trial_steps, f"{self.name}/seconds")
        return TrialResult(self.index, self.candidate.id, per_step, wall, waited_steps=self.waited_steps)

    def _note_error(self, error: BaseException, where: str) -> None:
        self.error = f"{where}: {describe_error(error)}"
        log.warning(
            "kungfu auto: trial %d (%s) failed in its %s: %s\n%s",
            self.index, self.candidate.id, where, describe_error(error), traceback.format_exc(limit=3),
        )  # fmt: skip

    def _agree_failure(self, what: str) -> bool:
        if agree_any(self.error is not None, f"{self.name}/failed/{what}"):
            self.failed = True
            if self.error is None:
                self.error = f"another worker failed ({what})"
        return self.failed


class TrialRunner:
    """Runs whole trials: switch, ``warmup`` steps, ``trial_steps`` timed steps, agreed result.

    ``switch(strategy)`` moves every worker's training to a strategy
    (collective); ``step()`` runs one real training step on the next batch.

    Example:
        >>> from kungfu_tf.proto import strategy_pb2
        >>> def bad_switch(s):
        ...     raise StrategyError("no such variable")
        >>> r = TrialRunner(bad_switch, step=lambda: None, warmup=0, trial_steps=1).run(3, strategy_pb2.Strategy())
        >>> r.failed, r.error
        (True, 'switch: StrategyError: no such variable')
    """

    def __init__(self, switch: SwitchFn, step: Callable[[], Any], warmup: int = 2, trial_steps: int = 5) -> None:
        Trial(0, strategy_pb2.Strategy(), warmup, trial_steps)  # the same checks, now
        self.switch = switch
        self.step = step
        self.warmup = warmup
        self.trial_steps = trial_steps

    def run(self, index: int, candidate: strategy_pb2.Strategy) -> TrialResult:
        """Trial number ``index`` of ``candidate`` (collective)."""
        trial = Trial(index, candidate, self.warmup, self.trial_steps)
        trial.begin(self.switch)
        while not trial.done:
            trial.run_step(self.step)
        return trial.result()
