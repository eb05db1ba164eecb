"""``AdaptiveTopologyPolicy``: switch the all-reduce topology when throughput drops (KungFu §6.2 (2)).

Example:
    >>> from kungfu_tf.policy import AdaptiveTopologyPolicy
    >>> policy = AdaptiveTopologyPolicy(drop=0.2, window=20, trial_steps=5)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kungfu_tf.ops.config import topology_name
from kungfu_tf.policy.base_policy import BasePolicy
from kungfu_tf.policy.context import PolicyContext
from kungfu_tf.policy.topology_links import link_loads, link_speeds, rank_candidates

DEFAULT_CANDIDATES = ("RING", "STAR", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE")
RATES_GATHER = "kungfu_policy/topology_link_rates"


class AdaptiveTopologyPolicy(BasePolicy):
    """Watches cluster throughput; when it falls ``drop`` below its recent best, tries the
    other topologies for ``trial_steps`` steps each and keeps the fastest.

    Link contention slows the collectives that cross the contended link; a
    topology that uses it less recovers throughput (KungFu: 5.5 -> 7 images/s).
    The policy averages ``metrics[metric]`` over windows of ``window`` steps;
    each window's mean is all-reduced (mean over workers), so every worker
    sees the same numbers and takes the same decisions. The best window
    since the last adaptation is the reference. A trial skips
    ``settle_steps`` steps after each switch (new connections), measures
    ``trial_steps`` steps, and ends on the fastest candidate (the current
    one included, measured again under the same conditions); that one's
    throughput becomes the new reference.

    Which candidates a trial tries, in which order, comes from the link
    rates (``metrics["link_rates"]``, ``comm_rates``: bytes/s exchanged with
    each peer) averaged over the window that saw the drop. Every worker's
    rates are gathered, so all rank from the same matrix. A link's speed is
    its rate divided by the share of the tensor the topology in force sends
    over it (topology_links.link_loads, which mirrors the runtime's graphs in
    rank order, BINARY_TREE_STAR by host): a link that carried more bytes
    in the same time is not thereby faster. A link below ``slow_link``
    times the fastest one's speed is slow. The candidates that use a slow
    link are not tried (unless all do); the others go best first by a cost
    model: the time the busiest link needs for its share, max over its links
    of load / speed (unmeasured links: the median normal one). A cost model
    rather than the slowest link alone, because a topology that puts twice
    the bytes on a link suffers its slowness twice (STAR's links to rank 0
    carry 2x the tensor, RING's 2(n-1)/n). Without rates (none measured yet,
    all zero) or without a slow link, the candidates keep their given order
    and all are tried (the old behaviour; ``slow_link=0`` always).

    Caveat: ``comm_rates`` are bytes over wall-clock time. In a synchronous
    all-reduce the links a topology loads alike carry their share within the
    same step, so they report the same speed whatever their capacity (a
    tc-limited link included): the ranking acts only on rates that differ
    per link beyond that (a runtime that timed each link's transfers would
    give them); otherwise the trial runs in the given order, as before.

    Args:
        candidates: topologies to try (default: all but AUTO).
        drop: relative drop below the best window that starts a trial
            (0.1: the paper's contention took 6.5 to 5.5 images/s, -15 %).
        window: steps per measurement window.
        trial_steps, settle_steps: steps measured / skipped per candidate.
        metric: the throughput metric (default "throughput", samples/s;
            steps/s when the runner has no batch size); a scalar metric
            (a per-worker list such as "worker_throughput" raises ValueError).
        slow_link: a link slower than this fraction of the fastest link is
            avoided (0 <= slow_link < 1; 0: try every candidate in order).

    A batch-size change changes the throughput by itself: the policy then
    forgets its reference (and ends a trial in progress, keeping the
    topology in force) and measures afresh, instead of taking a smaller
    batch's lower samples/s for contention.

    Example:
        >>> import kungfu_tf.keras as kfk
        >>> from kungfu_tf.policy import AdaptiveTopologyPolicy
        >>> cb = kfk.PolicyCallback([AdaptiveTopologyPolicy()], batch_size=256)  # doctest: +SKIP
    """

    def __init__(
        self,
        candidates: Sequence[str] = DEFAULT_CANDIDATES,
        drop: float = 0.1,
        window: int = 10,
        trial_steps: int = 5,
        settle_steps: int = 1,
        metric: str = "throughput",
        slow_link: float = 0.5,
    ):
        self.candidates = [topology_name(c) for c in candidates]
        if len(self.candidates) < 2:
            raise ValueError(f"AdaptiveTopologyPolicy: candidates must name at least 2 topologies, got {candidates!r}")
        if not 0 < drop < 1:
            raise ValueError(f"AdaptiveTopologyPolicy: drop must be in (0, 1), got {drop!r}")
        for name, value, least in (("window", window, 1), ("trial_steps", trial_steps, 1), ("settle_steps", settle_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"AdaptiveTopologyPolicy: {name} must be an int >= {least}, got {value!r}")
        self.drop, self.window, self.trial_steps, self.settle_steps = float(drop), window, trial_steps, settle_steps
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"AdaptiveTopologyPolicy: metric must be the name of a scalar metric, got {metric!r}")
        self.metric = metric
        if isinstance(slow_link, bool) or not isinstance(slow_link, (int, float)) or not 0 <= slow_link < 1:
            raise ValueError(f"AdaptiveTopologyPolicy: slow_link must be a number in [0, 1), got {slow_link!r}")
        self.slow_link = float(slow_link)
        self._batch_size: int | None = None  # the batch size the measurements belong to
        self.best: float | None = None
        self.trials: dict[str, float] = {}  # topology -> measured throughput of the current trial
        self.adaptations = 0
        self._samples: list[float] = []
        self._rates: list[list[float]] = []  # link_rates of the steps in _samples
        self._queue: list[str] = []  # topologies still to try
        self._skip = 0

    def config(self) -> dict[str, Any]:
        return {"candidates": self.candidates, "drop": self.drop, "window": self.window,
                "trial_steps": self.trial_steps, "settle_steps": self.settle_steps, "metric": self.metric,
                "slow_link": self.slow_link}  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        # The reference throughput; a trial in progress is not resumed (the
        # topology in force is not part of a checkpoint).
        return {"best": self.best, "adaptations": self.adaptations}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state.get("best")
        self.adaptations = int(state.get("adaptations", 0))

    @property
    def trying(self) -> bool:
        return bool(self._queue) or bool(self.trials)

    def after_step(self, ctx: PolicyContext) -> None:
        if ctx.batch_size != self._batch_size:
            if self._batch_size is not None:  # the old batch's throughput says nothing about the new one
                self.best, self.trials, self._queue, self._samples, self._skip = None, {}, [], [], 0
            self._batch_size = ctx.batch_size
        value = ctx.metrics.get(self.metric)
        if value is None and self.metric == "throughput" and ctx.metrics.get("step_time"):
            value = 1.0 / ctx.metrics["step_time"]  # no batch size given: steps/s
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer))):
            raise ValueError(
                f"AdaptiveTopologyPolicy: metric {self.metric!r} must be a scalar (a number per step), got "
                f"{type(value).__name__} {value!r}"
            )
        if self._skip:
            self._skip -= 1
            return
        if isinstance(value, (int, float)):
            self._samples.append(float(value))
            rates = ctx.metrics.get("link_rates")
            if isinstance(rates, (list, tuple, np.ndarray)) and len(rates) == ctx.size:
                self._rates.append([float(r) for r in rates])
        wanted = self.trial_steps if self.trying else self.window
        if len(self._samples) < wanted:
            return
        # Per-worker times differ; agree on the mean before deciding anything.
        mean = float(ctx.all_reduce(np.mean(self._samples), op="mean", name="kungfu_policy/topology_throughput"))
        self._samples.clear()
        rates, self._rates = self._rates, []
        if self.trying:
            self._trial_result(ctx, mean)
        elif self.best is None or mean > self.best:
            self.best = mean
        elif mean < (1 - self.drop) * self.best:
            others = [c for c in self.candidates if c != ctx.topology]
            others, note = self._ranked(ctx, others, rates)
            self._queue = [*others, ctx.topology]  # the current one last: measured under the same load
            self.trials = {}
            self._switch(ctx, f"throughput {mean:.4g} fell > {self.drop:.0%} below {self.best:.4g}: trying{note}")

    def _ranked(self, ctx: PolicyContext, others: list[str], rates: list[list[float]]) -> tuple[list[str], str]:
        """``others`` without the candidates that use a slow link, best first (see the class), and why."""
        if self.slow_link == 0 or ctx.size < 2:
            return others, ""
        # A worker without rates for every step of the window sends zeros; the
        # gather runs on every worker alike (the trial is agreed).
        mine = np.mean(rates, axis=0) if rates and all(len(r) == ctx.size for r in rates) else np.zeros(ctx.size)
        gathered = ctx.all_gather(np.asarray(mine, np.float64), name=RATES_GATHER)
        matrix = np.asarray(gathered, np.float64).reshape(ctx.size, ctx.size)
        hosts = [peer.rpartition(":")[0] for peer in ctx.peers]
        speeds = link_speeds(matrix, link_loads(ctx.topology, hosts))
        order, slow = rank_candidates(others, speeds, hosts, self.slow_link)
        if not slow:
            return others, ""
        fastest = float(np.nanmax(speeds))
        links = ", ".join(f"{i}-{j} at {speeds[i, j] / fastest:.2g}x" for i, j in slow)
        skipped = [c for c in others if c not in order]
        return order, f" (comm rates: slow links {links} the fastest" + (
            f"; not trying {', '.join(skipped)})" if skipped else ")")

    def _trial_result(self, ctx: PolicyContext, mean: float) -> None:
        self.trials[ctx.topology] = mean
        if self._queue:
            self._switch(ctx, "trial")
            return
        winner = max(self.trials, key=lambda t: (self.trials[t], -self.candidates.index(t) if t in self.candidates else 0))
        self.best = self.trials[winner]
        self.trials = {}
        self.adaptations += 1
        if winner != ctx.topology:
            ctx.set_topology(winner, reason=f"fastest in trial: {self.best:.4g}")

    def _switch(self, ctx: PolicyContext, reason: str) -> None:
        nxt = self._queue.pop(0)
        if nxt != ctx.topology:
            ctx.set_topology(nxt, reason=reason)
        self._skip = self.settle_steps
