"""``StrategyPolicy``: re-score the known strategies when the cluster or its links change, and switch to the best.

The best synchronisation strategy is a function of the cluster: all-reduce
for a few workers on one host, parameter servers or partitions when a link
is slow or the model has large sparse variables (AutoDist §2.4). This policy
watches for what changes that answer, re-scores the candidates the user
gave, and switches every worker to the winner with
:func:`kungfu_tf.optimizers.switch_strategy` (consensus on the strategy
bytes; the optimizer slots follow the variables).

Example:
    >>> from kungfu_tf.policy import StrategyPolicy
    >>> policy = StrategyPolicy(opt, ["AllReduce", "PartitionedPS"], link_change=0.5)   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kungfu_tf.ops import auto_probe_samples
from kungfu_tf.optimizers.strategy_switch import switch_strategy
from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy.builders.base import StrategyBuilder
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.source import StrategySource, check_source, resolve_strategy
from kungfu_tf.strategy.variable_info import VariableInfo, describe_variables

# scorer(candidates resolved for the running cluster, the model's variables, ctx): predicted seconds per step of
# each candidate, lower is better (e.g. strategy_scoring.CostModelScorer).
Scorer = Callable[[list[strategy_pb2.Strategy], list[VariableInfo], PolicyContext], Sequence[float]]
RATES_GATHER = "kungfu_policy/strategy_link_rates"
SCORES_REDUCE = "kungfu_policy/strategy_scores"
TRIAL_REDUCE = "kungfu_policy/strategy_trial_time"
PROBE_REDUCE = "kungfu_policy/strategy_trial_probing"


def label(source: StrategySource) -> str:
    """A short name of a candidate, for the log.

    Example:
        >>> label("PartitionedPS")
        'PartitionedPS'
    """
    if isinstance(source, strategy_pb2.Strategy):
        return source.id or "strategy proto"
    if isinstance(source, StrategyBuilder):
        return type(source).__name__
    return str(source)


def _check_int(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"StrategyPolicy: {name} must be an int >= {least}, got {value!r}")
    return int(value)


# Links that carried less than this share of the busiest link's bytes/s in the reference window are left out
# of the trigger: a strategy leaves some links nearly idle (PSLoadBalancing's owner of only a few biases, the
# policy's own small gathers), and the relative change of a few KB/s is noise. Counting them re-scored a job
# whose links had not changed (benchmarks/strategy_policy: "a link's rate changed by 98%" on a steady link).
BUSY_SHARE = 0.01


def link_change(reference: np.ndarray, now: np.ndarray) -> float:
    """The largest relative change of a busy link's rate (0 if no link was measured in both windows).

    A link counts if it was measured in both windows (rate > 0) and carried at
    least ``BUSY_SHARE`` of the busiest link's rate in ``reference``.

    Example:
        >>> link_change(np.array([[0, 100.0], [100.0, 0]]), np.array([[0, 40.0], [100.0, 0]]))
        0.6
        >>> link_change(np.array([[0, 100.0, 0.5]]), np.array([[0, 100.0, 0.05]]))  # 0.5 % of the busiest: idle
        0.0
    """
    measured = (reference > 0) & (now > 0)
    if not measured.any():
        return 0.0
    busy = measured & (reference >= BUSY_SHARE * float(np.max(reference)))
    if not busy.any():
        return 0.0
    return float(np.max(np.abs(now[busy] - reference[busy]) / reference[busy]))


class StrategyPolicy(BasePolicy):
    """Re-scores ``candidates`` after a resize or when the link rates change, and switches every worker to the best.

    Triggers (each agreed: every worker sees the same values):

    * the cluster size differs from the one the strategy was chosen for
      (a resize, a joiner admitted, a crash);
    * the link rates (``metrics["link_rates"]``, ``comm_rates``), averaged
      over ``window`` steps and gathered from every worker, moved by more
      than ``link_change`` (relative, on the link that moved most among
      those carrying at least 1 % of the busiest link's rate) from
      the window after the last decision (a switch changes the traffic,
      so the reference is measured again after each);
    * every ``rescore_every`` steps, if set.

    Scoring: with ``scorer`` (e.g. :class:`~kungfu_tf.policy.CostModelScorer`,
    AutoDist's cost model on link rates measured then; any callable that
    takes the candidates resolved for the running cluster, the model's
    variables and the context, and returns predicted seconds per step), the scores are averaged over the workers and the lowest wins.
    Without one, each candidate is measured: a trial switches to it, skips
    ``settle_steps`` steps (the re-trace), then waits while AUTO still
    measures the candidate's new collectives (the runtime's probe samples,
    :func:`kungfu_tf.ops.auto_probe_samples`, grew during the last step on
    some worker; at least one step, at most ``max_probe_wait_steps``; 0: no
    wait), times ``trial_steps`` steps (``metrics["step_time"]``, averaged
    over the workers) and the fastest wins, the one in force measured again
    last, under the same conditions. Steps that carry probe samples can be
    several times slower than the candidate will be (a 4 MiB class probed
    over a 100 Mbit/s link): timed, they made the policy keep the slower
    strategy (``make bench-strategy-policy``).

    Hysteresis against flapping: the winner replaces the strategy in force
    only if its score is at least ``min_gain`` (relative) better, and no
    sooner than ``min_dwell_steps`` steps after the last switch (a trigger
    waits until then). Every decision, refused ones included, goes to the
    decision log (``runner.log_lines``) with the scores behind it.

    In Keras ``fit`` a :class:`~kungfu_tf.keras.PolicyCallback` makes ``fit``
    trace its step again after a switch; in a custom loop define the step
    with ``kungfu_tf.elastic.function``.

    Args:
        optimizer: ``SynchronousSGDOptimizer(opt, strategy=...)`` (Keras 3).
        candidates: builders, builder names, protos or files (at least 1).

    Example:
        >>> import kungfu_tf.keras as kfk
        >>> from kungfu_tf.strategy import builders
        >>> policy = StrategyPolicy(opt, ["AllReduce", builders.PartitionedPS()], min_dwell_steps=50)  # doctest: +SKIP
        >>> model.fit(x, y, callbacks=[kfk.PolicyCallback([policy])])                        # doctest: +SKIP
    """

    def __init__(
        self,
        optimizer: Any,
        candidates: Sequence[StrategySource],
        scorer: Scorer | None = None,
        link_change: float = 0.5,
        window: int = 10,
        rescore_every: int | None = None,
        trial_steps: int = 3,
        settle_steps: int = 1,
        min_gain: float = 0.05,
        min_dwell_steps: int = 0,
        max_probe_wait_steps: int = 20,
    ):
        if not hasattr(type(optimizer), "_kungfu_build_base"):
            raise TypeError(
                "StrategyPolicy: optimizer must be a Keras 3 optimizer wrapped by SynchronousSGDOptimizer(opt, "
                f"strategy=...), got {type(optimizer).__module__}.{type(optimizer).__qualname__}"
            )
        self.optimizer = optimizer
        if isinstance(candidates, (str, strategy_pb2.Strategy, StrategyBuilder)) or not list(candidates):
            raise ValueError(f"StrategyPolicy: candidates must be a non-empty list of strategies, got {candidates!r}")
        for c in candidates:
            check_source(c)  # an unknown builder name or a missing file: now, not at the first trigger
        self.candidates = list(candidates)
        if scorer is not None and not callable(scorer):
            raise TypeError(f"StrategyPolicy: scorer must be callable or None, got {scorer!r}")
        self.scorer = scorer
        if isinstance(link_change, bool) or not isinstance(link_change, (int, float)) or link_change <= 0:
            raise ValueError(f"StrategyPolicy: link_change must be a number > 0, got {link_change!r}")
        if isinstance(min_gain, bool) or not isinstance(min_gain, (int, float)) or not 0 <= min_gain < 1:
            raise ValueError(f"StrategyPolicy: min_gain must be a number in [0, 1), got {min_gain!r}")
        self.link_change, self.min_gain = float(link_change), float(min_gain)
        self.window = _check_int("window", window, 1)
        self.rescore_every = None if rescore_every is None else _check_int("rescore_every", rescore_every, 1)
        self.trial_steps = _check_int("trial_steps", trial_steps, 1)
        self.settle_steps = _check_int("settle_steps", settle_steps, 0)
        self.min_dwell_steps = _check_int("min_dwell_steps", min_dwell_steps, 0)
        self.max_probe_wait_steps = _check_int("max_probe_wait_steps", max_probe_wait_steps, 0)
        self._probe_samples: Callable[[], Any] = auto_probe_samples  # replaced by unit tests
        self._probe_wait = 0
        self._samples_seen: int | None = None
        self.current: int | None = None  # the candidate in force (None: the optimizer's own strategy)
        self.switches = 0
        self.reports: list[Any] = []  # the SwitchReport of every switch, in order
        self._size: int | None = None
        self._reference: np.ndarray | None = None
        self._rates: list[list[float]] = []
        self._last_switch: int | None = None
        self._pending = ""
        self._trial: list[int] = []  # candidates still to measure
        self._measured: dict[int, float] = {}
        self._times: list[float] = []
        self._skip = 0

    def config(self) -> dict[str, Any]:
        return {"candidates": [label(c) for c in self.candidates], "scorer": self.scorer is not None,
                "link_change": self.link_change, "window": self.window, "rescore_every": self.rescore_every,
                "trial_steps": self.trial_steps, "settle_steps": self.settle_steps, "min_gain": self.min_gain,
                "min_dwell_steps": self.min_dwell_steps, "max_probe_wait_steps": self.max_probe_wait_steps}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {"current": self.current, "switches": self.switches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current = state.get("current")
        self.switches = int(state.get("switches", 0))

    # ------------------------------------------------------------------ hooks

    def after_step(self, ctx: PolicyContext) -> None:
        if self._trial or self._measured:
            self._trial_step(ctx)
            return
        reason = self._pending or self._trigger(ctx)
        if not reason:
            return
        if self._last_switch is not None and ctx.step - self._last_switch < self.min_dwell_steps:
            if not self._pending:
                ctx.log(f"strategy re-scoring deferred: {reason}; only {ctx.step - self._last_switch} steps since "
                        f"the last switch (min_dwell_steps={self.min_dwell_steps})")  # fmt: skip
            self._pending = reason
            return
        self._pending = ""
        if self.scorer is not None:
            self._decide_by_scores(ctx, reason)
        else:
            self._start_trial(ctx, reason)

    def _trigger(self, ctx: PolicyContext) -> str:
        """Why to re-score now ("" if not): agreed values only."""
        if self._size is None:
            self._size = ctx.size
        elif ctx.size != self._size:
            old, self._size = self._size, ctx.size
            self._reference, self._rates = None, []
            return f"cluster size {old} -> {ctx.size}"
        if self.rescore_every is not None and (ctx.step + 1) % self.rescore_every == 0:
            return f"every {self.rescore_every} steps"
        rates = ctx.metrics.get("link_rates")
        if isinstance(rates, (list, tuple, np.ndarray)) and len(rates) == ctx.size:
            self._rates.append([float(r) for r in rates])
        else:  # not measured on this worker: zeros (every worker gathers alike)
            self._rates.append([0.0] * ctx.size)
        if len(self._rates) < self.window or ctx.size < 2:
            return ""
        mine = np.mean(self._rates, axis=0)
        self._rates = []
        matrix = np.asarray(ctx.all_gather(mine.astype(np.float64), name=RATES_GATHER), np.float64)
        matrix = matrix.reshape(ctx.size, ctx.size)
        if self._reference is None:
            self._reference = matrix
            return ""
        moved = link_change(self._reference, matrix)
        if moved > self.link_change:
            self._reference = matrix
            return f"a link's rate changed by {moved:.0%} (> link_change={self.link_change:.0%})"
        return ""

    # --------------------------------------------------------------- scoring

    def _decide_by_scores(self, ctx: PolicyContext, reason: str) -> None:
        variables = describe_variables(list(self.optimizer._kungfu_model_variables))
        cluster = ClusterSpec.current()
        resolved = [resolve_strategy(c, variables, cluster) for c in self.candidates]
        scores = [float(s) for s in self.scorer(resolved, variables, ctx)]  # type: ignore[misc]
        if len(scores) != len(self.candidates):
            raise ValueError(f"StrategyPolicy: the scorer gave {len(scores)} scores for {len(self.candidates)} candidates")
        agreed = [float(s) for s in ctx.all_reduce(np.asarray(scores, np.float64), op="mean", name=SCORES_REDUCE)]
        self._choose(ctx, agreed, f"{reason}; scores (s/step)")

    def _start_trial(self, ctx: PolicyContext, reason: str) -> None:
        order = [i for i in range(len(self.candidates)) if i != self.current]
        if self.current is not None:
            order.append(self.current)  # measured again last, under the same conditions
        self._trial, self._measured = order, {}
        ctx.log(f"strategy trial ({reason}): measuring {', '.join(label(self.candidates[i]) for i in order)}")
        self._next_trial(ctx)

    def _next_trial(self, ctx: PolicyContext) -> None:
        nxt = self._trial[0]
        if nxt != self.current:
            self._switch(ctx, nxt, "trial")
        self._skip, self._times = self.settle_steps, []
        self._probe_wait, self._samples_seen = self.max_probe_wait_steps, None

    def _trial_step(self, ctx: PolicyContext) -> None:
        if self._skip:
            self._skip -= 1
            return
        if self._probing(ctx):
            return
        self._times.append(float(ctx.metrics.get("step_time") or 0.0))
        if len(self._times) < self.trial_steps:
            return
        mean = float(ctx.all_reduce(np.mean(self._times), op="mean", name=TRIAL_REDUCE))
        self._measured[self._trial.pop(0)] = mean
        if self._trial:
            self._next_trial(ctx)
            return
        measured, self._measured = self._measured, {}
        times = [measured.get(i, float("inf")) for i in range(len(self.candidates))]
        self._choose(ctx, times, "trial; measured (s/step)")

    def _probing(self, ctx: PolicyContext) -> bool:
        """True while AUTO measured something during the last step on some worker (agreed): not a step to time.

        The first call after the settle steps only reads the count; each later
        one compares with the previous read, until a step without samples
        (which is then the first timed) or ``max_probe_wait_steps`` reads.
        The agreement runs on a fixed topology: under AUTO its own size class
        would be probed by the calls that wait for the probes to stop.
        """
        if self._probe_wait == 0:
            return False
        now = int(np.asarray(self._probe_samples()))
        seen, self._samples_seen = self._samples_seen, now
        if seen is None:
            return True
        grew = float(np.asarray(ctx.all_reduce(float(now != seen), op="max", name=PROBE_REDUCE, topology="STAR")))
        if not grew:
            self._probe_wait = 0
            return False
        self._probe_wait -= 1
        if self._probe_wait == 0:
            ctx.log(f"strategy trial: AUTO still measured after {self.max_probe_wait_steps} steps; timing anyway")
        return True

    def _choose(self, ctx: PolicyContext, scores: list[float], why: str) -> None:
        best = min(range(len(scores)), key=lambda i: (scores[i], i))
        shown = ", ".join(f"{label(c)} {s:.4g}" for c, s in zip(self.candidates, scores))
        if best == self.current:
            ctx.log(f"strategy {label(self.candidates[best])} kept ({why}: {shown})")
            return
        if self.current is not None and not scores[best] < (1 - self.min_gain) * scores[self.current]:
            ctx.log(f"strategy {label(self.candidates[best])} refused: not {self.min_gain:.0%} better than "
                    f"{label(self.candidates[self.current])} ({why}: {shown})")  # fmt: skip
            return
        self._switch(ctx, best, f"{why}: {shown}")

    def _switch(self, ctx: PolicyContext, index: int, reason: str) -> None:
        old = self.optimizer._kungfu_plan.strategy.id if self.current is None else label(self.candidates[self.current])
        report = switch_strategy(self.optimizer, self.candidates[index])
        self.reports.append(report)
        self.current = index
        self.switches += 1
        self._last_switch = ctx.step
        self._reference, self._rates, self._size = None, [], ctx.size
        ctx.log(f"strategy {old} -> {label(self.candidates[index])} in {report.seconds:.3f} s ({reason})")
