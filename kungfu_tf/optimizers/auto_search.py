"""The search of ``builders.Auto`` on the user's own training steps (the optimizer side).

``SynchronousSGDOptimizer(opt, strategy=builders.Auto(...))`` starts on the
all-reduce strategy; when the optimizer is built, an :class:`AutoSearchSession`
is installed as the step driver (kungfu_tf/strategy/step_driver.py), and
``kungfu_tf.elastic.function`` (or, in Keras ``fit``,
``kungfu_tf.keras.AutoSearchCallback``) hands it every step call:

* its first call starts the search (collective: the workers calibrate the
  links and build the same search model);
* each candidate of the search (kungfu_tf/strategy/auto/search.py) becomes a
  trial (kungfu_tf/strategy/auto/trials.py): ``switch_strategy`` to it, then
  the next ``warmup + trial_steps`` calls are its steps; a call that fails
  under a candidate fails the trial on every worker and runs again under
  the next candidate, so no batch is lost;
* when the budget is spent, every worker switches to the fastest strategy
  measured, the session leaves, and later membership changes re-build
  through ``Auto.build`` (the best strategy for this cluster);
* the input running out (``tf.errors.OutOfRangeError``: Keras ``fit`` ends an
  epoch of unknown length that way) is no failure of the candidate: it goes
  up to the loop and the trial goes on at the next step;
* a step traced or run outside a driven step call (a plain ``tf.function``,
  ``fit`` without ``kungfu_tf.keras.AutoSearchCallback``) is refused with a
  ``StrategyError`` naming what to use (:meth:`AutoSearchSession.check_driven`):
  it would train on the starting strategy and never search;
* a membership change during the search ends it at the next step, on every
  member alike and without a collective (a joiner never started it):
  the change re-built the strategy through ``Auto.build`` (no result yet:
  the all-reduce builder's strategy for the new cluster) and training goes
  on with it;
* with ``Auto(research_budget=N)``, a membership change to a cluster of two
  or more workers that Auto has no result for installs a new session on
  every worker of the new cluster, joiners included (the change's apply
  listener, kungfu_tf/optimizers/strategy_resize.py): the next step starts
  a search of N trials there, whose result is kept beside the others.

Example:
    >>> import keras
    >>> from kungfu_tf.optimizers import SynchronousSGDOptimizer
    >>> from kungfu_tf.strategy import builders, step_driver
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.Auto(budget=2))
    >>> opt.build([keras.Variable([1.0, 2.0], name="w")])
    >>> type(step_driver.installed()).__name__
    'AutoSearchSession'
    >>> step_driver.uninstall()
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import step_driver
from kungfu_tf.strategy.auto.builder import Auto, AutoResult
from kungfu_tf.strategy.auto.search import (
    Search,
    SearchBudget,
    SearchModel,
    check_searchable,
)
from kungfu_tf.strategy.auto.search_model import AutoDistModel
from kungfu_tf.strategy.auto.trials import Trial
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.variable_info import VariableInfo, describe_variables

log = logging.getLogger("kungfu_tf.strategy.auto")


class AutoSearchSession:
    """Turns the first training steps of ``optimizer`` into the trials of ``auto``'s search (module docstring).

    Example:
        >>> session = AutoSearchSession.__new__(AutoSearchSession)
        >>> session.finished = True
        >>> session.run_step(lambda: "a step")
        'a step'
    """

    def __init__(self, optimizer: Any, auto: Auto, budget: SearchBudget | None = None) -> None:
        self._optimizer = weakref.ref(optimizer)
        self.auto = auto
        self.research = budget is not None  # a search of a new cluster after a membership change
        self.budget = budget or auto.budget
        self.search: Search | None = None
        self.trial: Trial | None = None
        self.finished = False
        self._cluster: ClusterSpec | None = None
        self._version = -1
        self._started = 0.0

    def run_step(self, call: Callable[[], Any]) -> Any:
        """Runs one of the user's step calls as a step of the current trial (or plainly, after the search)."""
        if self.finished:
            return call()
        optimizer = self._optimizer()
        if optimizer is None:  # the optimizer is gone: nothing left to search for
            self._leave()
            return call()
        try:
            return self._search_step(optimizer, call)
        except tf.errors.OutOfRangeError:
            raise  # the end of the input (an epoch's end in fit): the trial goes on at the next step
        except Exception:
            # Not a failed trial (those are scored): the workers disagree on a candidate, no trial
            # succeeded, a collective failed. The search is over; training may go on as it stands.
            self._leave()
            raise

    def check_driven(self) -> None:
        """``StrategyError`` if the search has not finished and the running code is no driven step call.

        The optimizer calls it whenever its update is built (traced, or run
        eagerly): a step that nobody hands to the search would train on the
        starting all-reduce strategy for ever, without a word.
        """
        if self.finished or step_driver.in_step():
            return
        raise StrategyError(
            "builders.Auto searches on training steps handed to it, and this training step was not: it would train "
            "on the starting all-reduce strategy and never search. In Keras fit, add "
            "kungfu_tf.keras.AutoSearchCallback() to fit's callbacks; in a custom loop, define the step with "
            "kungfu_tf.elastic.function instead of tf.function (it traces the step again after each switch); or "
            "search beforehand (kungfu-strategy search) and pass the strategy file it writes"
        )

    def _search_step(self, optimizer: Any, call: Callable[[], Any]) -> Any:
        if self.search is None:
            self._start(optimizer)
        elif _cluster_version() != self._version:
            # A membership change between two steps: the trials so far measured another cluster, and a
            # joiner never started this search (its next collective would wait for ever). Every member sees
            # the new version at this same step, so they all stop here, without a collective.
            self._abandon(optimizer)
            return call()
        assert self.search is not None
        while True:
            if self.finished:
                # A membership change inside the step that just ran (resize in a tf.function) stopped this
                # search (strategy_resize.py): the step runs on what the change re-built.
                return call()
            if self.trial is None or self.trial.done:
                if self.trial is not None:
                    self.search.record(self.trial.result())
                candidate = self.search.next_candidate()
                if candidate is None:
                    self._finish(optimizer)
                    return call()
                self.trial = Trial(
                    self.search.trials_done, candidate, self.auto.warmup, self.auto.trial_steps,
                    probe_wait_steps=self.auto.probe_wait_steps,
                )  # fmt: skip
                self.trial.begin(lambda s: self._switch(optimizer, s))
                continue  # a failed switch ends the trial at once
            ok, out = self.trial.run_step(call)
            if ok:
                return out
            # The step failed under this candidate on some worker: the same batch runs under the next.

    def _start(self, optimizer: Any) -> None:
        import kungfu_tf

        self._started = time.monotonic()
        variables = describe_variables(list(optimizer._kungfu_model_variables))
        check_searchable(variables, kungfu_tf.size())
        self._cluster = ClusterSpec.current()
        self._version = _cluster_version()
        model = make_search_model(self.auto, variables, self._cluster)
        first = kungfu_tf.rank() == 0
        self.search = Search(
            model,
            self.budget,
            candidates_per_round=self.auto.candidates_per_round,
            trials_per_round=self.auto.trials_per_round,
            seed=self.auto.seed,
            log_path=self.auto.log_path if first else None,
            show_progress=self.auto.show_progress and first,
            initial=[optimizer._kungfu_plan.strategy, *self.auto.extra_candidates],
            confirm_top=self.auto.confirm_top,
            log_append=self.research,
        )

    def _finish(self, optimizer: Any) -> None:
        import kungfu_tf

        assert self.search is not None and self._cluster is not None
        search = self.search
        search.close()
        self._leave()
        best = search.best  # the same on every worker: it depends only on agreed measurements
        self._switch(optimizer, best)
        self.auto.result = AutoResult(
            best, self._cluster, search.best_seconds, list(search.records), time.monotonic() - self._started
        )
        if self.auto.show_progress and kungfu_tf.rank() == 0:
            print(
                f"kungfu auto: training on {best.id!r} ({search.best_seconds * 1e3:.1f} ms/step measured), chosen "
                f"from {search.trials_done} trials in {self.auto.result.search_seconds:.1f} s",
                flush=True,
            )

    def _switch(self, optimizer: Any, strategy: strategy_pb2.Strategy) -> None:
        from kungfu_tf.optimizers.strategy_switch import switch_strategy

        switch_strategy(optimizer, strategy)
        # What a membership change re-builds: Auto (a builder), not the candidate switch_strategy keeps,
        # a strategy written for this cluster's size that a shrink would refuse to re-map.
        object.__setattr__(optimizer, "_kungfu_strategy", self.auto)

    def _abandon(self, optimizer: Any) -> None:
        import kungfu_tf

        assert self.search is not None
        self.search.close()
        self._leave()
        if kungfu_tf.rank() == 0:
            log.warning(
                "kungfu auto: the cluster changed during the search (after %d trials): search abandoned, training "
                "goes on with %r re-built for the new cluster", self.search.trials_done,
                optimizer._kungfu_plan.strategy.id,
            )  # fmt: skip

    def stop(self, optimizer: Any) -> None:
        """Ends this session at a membership change, on every worker of the new cluster alike, with no collective.

        A search under way is abandoned (it measured another cluster); one
        not started yet leaves quietly. Either way no later step runs it: a
        session left installed would start its search at the next step on
        the members only (a joiner has none), and their collectives would wait
        for ever.
        """
        if self.finished:
            return
        if self.search is not None:
            self._abandon(optimizer)
        else:
            self._leave()

    def _leave(self) -> None:
        self.finished = True
        step_driver.uninstall(self)


def make_search_model(auto: Auto, variables: Sequence[VariableInfo], running: ClusterSpec) -> SearchModel:
    """The search model of ``auto`` on the ``running`` cluster (collective: it calibrates the links)."""
    view = auto.cluster
    if view is not None and view.replicas != running.replicas:
        raise StrategyError(f"Auto(cluster=...) describes {view.replicas} replicas, the job has {running.replicas}")
    if auto.search_model is not None:
        return auto.search_model(variables, view or running)
    if view is not None:  # declared rates for the hosts described, nothing measured
        return AutoDistModel.declared(variables, view)
    return AutoDistModel.calibrated(variables, running)


def _cluster_version() -> int:
    from kungfu_tf.ops import cluster_version

    return int(cluster_version())


def start_auto_search(optimizer: Any, auto: Auto, budget: SearchBudget | None = None) -> AutoSearchSession:
    """Installs the search of ``auto`` on ``optimizer``'s steps (when the optimizer is built, and with
    ``research_budget`` after a membership change); ``budget``: instead of ``auto.budget``. A session
    still installed for ``optimizer`` is stopped first."""
    previous = optimizer.__dict__.get("_kungfu_auto_session")
    if previous is not None:
        previous.stop(optimizer)
    session = AutoSearchSession(optimizer, auto, budget)
    step_driver.install(session)
    object.__setattr__(optimizer, "_kungfu_auto_session", session)  # for check_driven at every apply
    return session
