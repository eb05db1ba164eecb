"""The budgeted search of AutoDist's Algorithm 1, one trial at a time.

    while budget left:
        fidelity l of the ranker                      (how far its ranking can be trusted)
        sample N candidates                           (guided sampler)
        score them, select K for trials               (score vs diversity, above l)
        run the K trials                              (real steps, kungfu_tf/strategy/auto/trials.py)
        best := best measured; refine the ranker with the K measurements
    confirm: the ``confirm_top`` fastest measured run one trial more each;
    best := the lowest mean of a strategy's trials

:class:`Search` hands out one candidate at a time (:meth:`Search.next_candidate`)
and takes its trial's result (:meth:`Search.record`), so the same search runs
inside a user's training loop (``builders.Auto``, one step at a time) and in
``kungfu-strategy search`` (which drives its own steps). Everything it
decides depends only on agreed inputs (the sampler's seed, the trials'
agreed measurements and wall times), so every worker takes the same
decisions without talking; the trials check it (consensus on each candidate).

The confirmation (not in Algorithm 1) answers the winner's curse: the
fastest of several noisy measurements is mostly the luckiest one. With
NCF on one host a candidate measured 95 ms in its trial and 143 ms in
another search's trial of it, and was chosen over PS, measured 107 ms
there and 65-87 ms everywhere else (``make bench-strategies``, 2026-11-27).
A second, independent trial of the few fastest, and the choice by the mean,
costs ``confirm_top`` trials and removes most of that luck.

The search model — sampler, calibrated cost model, ranker, trial selection —
is behind :class:`SearchModel`; :class:`AutoDistModel` is the one of
``kungfu_tf.strategy.auto``.

A JSON line per trial goes to ``log_path`` (trial, round, strategy id, the
cost model's predicted and the measured seconds per step, the score the
search chose it by, the fidelity, elapsed seconds), and rank 0 prints one
progress line per trial.

Example:
    >>> from kungfu_tf.proto import strategy_pb2
    >>> from kungfu_tf.strategy.auto.trials import TrialResult
    >>> class Two:  # a search model with two candidates and a fixed score
    ...     def sample(self, count, seed):
    ...         return [strategy_pb2.Strategy(id=i, node_config=[strategy_pb2.Node(var_name=i)]) for i in "ab"]
    ...     def predict(self, strategies): return [1.0 for _ in strategies]
    ...     def cost_model_predict(self, strategies): return [1.0 for _ in strategies]
    ...     def learn(self, strategies, measured): pass
    ...     def fidelity(self): return 0.0
    ...     def select(self, candidates, scores, k): return list(range(min(k, len(candidates))))
    >>> search = Search(Two(), SearchBudget(trials=2), show_progress=False)
    >>> for seconds in (0.5, 0.2):
    ...     c = search.next_candidate()
    ...     _ = search.record(TrialResult(search.trials_done, c.id, seconds, 1.0))
    >>> search.next_candidate() is None, search.best.id
    (True, 'b')
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import IO, TYPE_CHECKING, Any, Protocol

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.format import canonical_bytes

if TYPE_CHECKING:  # trials import TensorFlow; the search itself does not need it
    from kungfu_tf.strategy.auto.trials import TrialResult

log = logging.getLogger("kungfu_tf.strategy.auto")


class SearchModel(Protocol):
    """What Algorithm 1 needs of its search model (lower scores are faster)."""

    def sample(self, count: int, seed: int) -> list[strategy_pb2.Strategy]:
        """About ``count`` valid candidates, the same for the same seed on every worker."""

    def predict(self, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        """A score per strategy, lower for faster (the ranker's once trusted, else the cost model's seconds)."""

    def cost_model_predict(self, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        """The predefined cost model's seconds per step (logged beside the scores, to compare them)."""

    def learn(self, strategies: Sequence[strategy_pb2.Strategy], measured: Sequence[float]) -> None:
        """Refines the ranker with every trial so far (``math.inf``: the trial failed)."""

    def fidelity(self) -> float:
        """How far the scores are trusted now (pairwise accuracy: 0.5 a coin, 1 perfect)."""

    def select(self, candidates: Sequence[strategy_pb2.Strategy], scores: Sequence[float], k: int) -> list[int]:
        """Indices of at most ``k`` candidates to try (score vs diversity at this fidelity)."""



def check_round_sizes(candidates_per_round: int, trials_per_round: int) -> None:
    """StrategyError unless a round samples and tries at least one candidate."""
    if candidates_per_round < 1 or trials_per_round < 1:
        raise StrategyError(
            f"candidates_per_round and trials_per_round must be >= 1, got {candidates_per_round} and {trials_per_round}"
        )

@dataclass(frozen=True)
class SearchBudget:
    """How much the search may spend: ``trials`` trials and/or ``seconds`` of trial time (whichever ends first).

    Example:
        >>> SearchBudget(trials=0)
        Traceback (most recent call last):
        ...
        kungfu_tf.strategy.errors.StrategyError: the search budget must allow at least one trial, got trials=0
    """

    trials: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.trials is None and self.seconds is None:
            raise StrategyError("the search budget needs a number of trials or of seconds (or both)")
        if self.trials is not None and (isinstance(self.trials, bool) or not isinstance(self.trials, int) or self.trials < 1):
            raise StrategyError(f"the search budget must allow at least one trial, got trials={self.trials!r}")
        if self.seconds is not None and not (isinstance(self.seconds, (int, float)) and self.seconds > 0):
            raise StrategyError(f"the search budget in seconds must be > 0, got seconds={self.seconds!r}")


@dataclass(frozen=True)
class SearchRecord:
    """One line of the search log: a trial's prediction and measurement (seconds per step)."""

    trial: int
    round: int
    strategy_id: str
    predicted_seconds: float | None  # the cost model's step time (None: it cannot score the candidate)
    score: float | None  # what the search ranked it by when it chose it (the ranker's score, once trusted)
    measured_seconds: float | None  # None: the trial failed (JSON has no infinity)
    fidelity: float
    elapsed_seconds: float
    best_measured_seconds: float | None
    error: str | None = None
    confirmation: bool = False  # a second trial of one of the fastest, after the budget (module docstring)
    waited_steps: int = 0  # untimed steps after the warm-up while the runtime's AUTO probed


class Search:
    """AutoDist's Algorithm 1 over ``model``, within ``budget`` (module docstring).

    Args:
        model: the sampler, scores, ranker and selection (:class:`SearchModel`).
        budget: trials and/or seconds of trials.
        candidates_per_round: N, candidates sampled per round.
        trials_per_round: K, trials per round (the ranker learns after each round).
        seed: the sampler's seed of round 0 (round r uses ``seed + r``).
        log_path: JSON lines file, one line per trial (rank 0 only, if given).
        log_append: add to ``log_path`` instead of starting it afresh (a search
            of a new cluster after a membership change keeps the earlier lines).
        show_progress: print one line per trial to ``out``.
        initial: strategies to try first, before any sampled one (e.g. the
            one training started with); they count against the budget.
        confirm_top: after the budget, this many of the fastest strategies
            measured (0, or at least 2) run one more trial each, beyond the
            budget, and the best is the one whose trials' mean is lowest.
    """

    def __init__(
        self,
        model: SearchModel,
        budget: SearchBudget,
        candidates_per_round: int = 32,
        trials_per_round: int = 4,
        seed: int = 0,
        log_path: str | os.PathLike[str] | None = None,
        show_progress: bool = True,
        out: IO[str] | None = None,
        initial: Sequence[strategy_pb2.Strategy] = (),
        confirm_top: int = 0,
        log_append: bool = False,
    ) -> None:
        check_round_sizes(candidates_per_round, trials_per_round)
        check_confirm_top(confirm_top)
        self.model = model
        self.budget = budget
        self.candidates_per_round = candidates_per_round
        self.trials_per_round = trials_per_round
        self.seed = seed
        self.show_progress = show_progress
        self.out = out
        self.records: list[SearchRecord] = []
        self.round = 0
        mode = "a" if log_append else "w"
        self._log = open(log_path, mode, encoding="utf-8") if log_path else None  # noqa: SIM115 (closed in close())
        self._tried: list[strategy_pb2.Strategy] = []
        self._measured: list[float] = []
        self._seen: set[bytes] = set()
        self._queue: list[tuple[strategy_pb2.Strategy, float]] = []
        self._spent_seconds = 0.0
        self._fidelity = 0.0
        self._exhausted = False
        self._started = time.monotonic()
        self._round_start = 0
        self.confirm_top = confirm_top
        self._confirming = False
        self._confirm_total = 0
        self._ids: set[str] = set()
        if initial:
            initial = [s for s in initial if self._is_new(s)]
            self._queue = list(zip(initial, self._safely(self.model.predict, initial)))

    @property
    def trials_done(self) -> int:
        """Trials recorded so far."""
        return len(self._tried)

    @property
    def spent_seconds(self) -> float:
        """Agreed wall time of the trials so far."""
        return self._spent_seconds

    def budget_left(self) -> bool:
        """True while another trial fits the budget."""
        if self.budget.trials is not None and self.trials_done >= self.budget.trials:
            return False
        return self.budget.seconds is None or self._spent_seconds < self.budget.seconds

    def next_candidate(self) -> strategy_pb2.Strategy | None:
        """The next strategy to try, or None when the budget and the confirmation are spent.

        The exploration ends when the budget is spent or nothing new is left
        to try; then come the confirmation trials (``confirm_top``).
        """
        if not self._confirming and self.budget_left():
            while not self._queue and not self._exhausted:
                self._plan_round()
            if self._queue:
                return self._queue[0][0]
        if not self._confirming:
            self._start_confirmation()
        return self._queue[0][0] if self._queue else None

    def record(self, result: TrialResult) -> SearchRecord:
        """Takes the result of the trial of the last candidate :meth:`next_candidate` gave."""
        if not self._queue:
            raise RuntimeError("record() without a candidate from next_candidate()")
        candidate, predicted = self._queue.pop(0)
        self._tried.append(candidate)
        self._measured.append(result.seconds_per_step)
        self._spent_seconds += result.wall_seconds
        best = min(self._measured)
        record = SearchRecord(
            trial=len(self._tried) - 1,
            round=self.round,
            strategy_id=candidate.id,
            predicted_seconds=_finite(self._safely(self.model.cost_model_predict, [candidate])[0]),
            score=_finite(predicted),
            measured_seconds=None if result.failed else result.seconds_per_step,
            fidelity=self._fidelity,
            elapsed_seconds=round(time.monotonic() - self._started, 3),
            best_measured_seconds=None if math.isinf(best) else best,
            error=result.error,
            confirmation=self._confirming,
            waited_steps=result.waited_steps,
        )
        self.records.append(record)
        if self._log is not None:
            self._log.write(json.dumps(asdict(record)) + "\n")
            self._log.flush()
        if self.show_progress:
            self._print_progress(record)
        if not self._queue or not self.budget_left():
            self._learn()
        return record

    @property
    def best(self) -> strategy_pb2.Strategy:
        """The strategy whose trials' mean time is lowest (``StrategyError`` if no trial succeeded).

        Without confirmation trials every strategy has one trial: the fastest measured.
        """
        means = self._means()
        if not means or math.isinf(min(m for _, m in means)):
            raise StrategyError(
                f"no trial of the search succeeded ({len(self._measured)} tried; the search log and the workers' "
                "warnings say why each failed)"
            )
        return min(means, key=lambda sm: sm[1])[0]

    @property
    def best_seconds(self) -> float:
        """The best strategy's mean measured seconds per step (``math.inf`` if none succeeded)."""
        return min((m for _, m in self._means()), default=math.inf)

    def _means(self) -> list[tuple[strategy_pb2.Strategy, float]]:
        """Every strategy tried, first trial's order, with the mean of its trials (inf if one failed)."""
        groups: dict[bytes, list[Any]] = {}
        for strategy, seconds in zip(self._tried, self._measured, strict=True):
            groups.setdefault(_nodes_key(strategy), [strategy, []])[1].append(seconds)
        return [(strategy, sum(times) / len(times)) for strategy, times in groups.values()]

    def _start_confirmation(self) -> None:
        """The ``confirm_top`` fastest strategies (by mean), fastest first, as the last trials."""
        self._confirming = True
        finite = sorted(((s, m) for s, m in self._means() if not math.isinf(m)), key=lambda sm: sm[1])
        top = finite[: self.confirm_top] if self.confirm_top >= 2 else []
        self._queue = top if len(top) >= 2 else []  # one strategy alone: nothing to compare
        self._confirm_total = len(self._queue)

    def close(self) -> None:
        """Closes the search log."""
        if self._log is not None:
            self._log.close()
            self._log = None

    @staticmethod
    def _safely(predict: Any, strategies: Sequence[strategy_pb2.Strategy]) -> list[float]:
        """``predict(strategies)``; a strategy the model cannot score (it does not fit the model) scores ``inf``."""
        try:
            return [float(x) for x in predict(strategies)]
        except StrategyError:
            out = []
            for strategy in strategies:
                try:
                    out.append(float(predict([strategy])[0]))
                except StrategyError as e:
                    log.warning("kungfu auto: cannot score candidate %r: %s", strategy.id, e)
                    out.append(math.inf)
            return out

    def _is_new(self, strategy: strategy_pb2.Strategy) -> bool:
        # The same nodes under another name (a builder's strategy drawn again by the sampler) are not new.
        key = _nodes_key(strategy)
        if key in self._seen:
            return False
        self._seen.add(key)
        self._ids.add(strategy.id)
        return True

    def _unique_id(self, strategy: strategy_pb2.Strategy) -> strategy_pb2.Strategy:
        """``strategy``, renamed ``<id>-r<round>`` if another strategy tried had its id (samplers name by index)."""
        if strategy.id not in self._ids:
            return strategy
        renamed = strategy_pb2.Strategy()
        renamed.CopyFrom(strategy)
        renamed.id = f"{strategy.id}-r{self.round}"
        return renamed

    def _plan_round(self) -> None:
        """Algorithm 1, lines 2-5: fidelity, sample, filter and select this round's trials."""
        if len(self._tried) > self._round_start:
            self.round += 1
        self._round_start = len(self._tried)
        self._fidelity = float(self.model.fidelity())
        pool = [
            self._unique_id(s)
            for s in self.model.sample(self.candidates_per_round, self.seed + self.round)
            if _nodes_key(s) not in self._seen
        ]
        pool = [s for s in pool if self._is_new(s)]
        if not pool:
            self._exhausted = True  # the sampler has nothing left that was not tried
            return
        scores = self.model.predict(pool)
        k = self.trials_per_round
        if self.budget.trials is not None:
            k = min(k, self.budget.trials - self.trials_done)
        chosen = self.model.select(pool, scores, k)
        self._queue = [(pool[i], float(scores[i])) for i in chosen]
        if not self._queue:
            self._exhausted = True

    def _learn(self) -> None:
        """Algorithm 1, line 8: the ranker learns from every trial so far."""
        self.model.learn(list(self._tried), list(self._measured))

    def _print_progress(self, r: SearchRecord) -> None:
        out = self.out or sys.stdout
        limit = f"/{self.budget.trials}" if self.budget.trials is not None else ""
        what = f"trial {r.trial + 1}{limit}"
        if r.confirmation:
            what = f"confirmation {sum(x.confirmation for x in self.records)}/{self._confirm_total}"
        measured = "failed" if r.measured_seconds is None else f"{r.measured_seconds * 1e3:.1f} ms/step"
        best = "-" if r.best_measured_seconds is None else f"{r.best_measured_seconds * 1e3:.1f} ms"
        predicted = "-" if r.predicted_seconds is None else f"{r.predicted_seconds * 1e3:.1f} ms"
        print(
            f"kungfu auto: {what} round {r.round} {r.strategy_id}: predicted {predicted}, "
            f"measured {measured} (best {best}, fidelity {r.fidelity:.2f}, {self._spent_seconds:.1f} s of trials)",
            file=out,
            flush=True,
        )


def _nodes_key(strategy: strategy_pb2.Strategy) -> bytes:
    """What makes a strategy what it is: its canonical bytes without its name."""
    unnamed = strategy_pb2.Strategy()
    unnamed.CopyFrom(strategy)
    unnamed.ClearField("id")
    return canonical_bytes(unnamed)


def check_confirm_top(confirm_top: int) -> None:
    """StrategyError unless ``confirm_top`` is 0 (no confirmation) or at least 2 (a comparison)."""
    if isinstance(confirm_top, bool) or not isinstance(confirm_top, int) or confirm_top < 0 or confirm_top == 1:
        raise StrategyError(
            f"confirm_top must be 0 (no confirmation trials) or an int >= 2 (the fastest strategies compared once "
            f"more), got {confirm_top!r}"
        )


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x


def no_trainable_variables_error() -> StrategyError:
    """The error every surface raises for a model with nothing to synchronise."""
    return StrategyError("the model has no trainable variables: there is no strategy to search for")


def check_searchable(variables: Sequence[Any], replicas: int) -> None:
    """``StrategyError`` for a search that cannot run: no variables, or one worker (nothing to measure a link on).

    Example:
        >>> check_searchable([], 2)
        Traceback (most recent call last):
        ...
        kungfu_tf.strategy.errors.StrategyError: the model has no trainable variables: there is no strategy to search for
    """
    if not variables:
        raise no_trainable_variables_error()
    check_workers(replicas)


def check_workers(replicas: int) -> None:
    """``StrategyError`` for fewer than 2 workers: no link to calibrate, no strategy differs from another."""
    if replicas < 2:
        raise StrategyError(
            f"the strategy search needs at least 2 workers to calibrate links and compare strategies, the job has "
            f"{replicas} (start it with kungfu-run -np 2 or more, or pass a fixed strategy)"
        )
