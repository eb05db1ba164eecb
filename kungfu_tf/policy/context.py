"""``PolicyContext``: what a policy hook sees (KungFu Tab. 2) and how it asks for changes.

Example:
    >>> from kungfu_tf.policy import BasePolicy
    >>> class Log(BasePolicy):
    ...     def after_step(self, ctx):
    ...         print(ctx.step, ctx.batch_size, ctx.metrics.get("gns"))
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective
from kungfu_tf.ops.config import topology_name
from kungfu_tf.policy.variable_access import VariableAccess


class TrainingView(Protocol):
    """What a :class:`PolicyContext` reads of the training it describes (the :class:`~kungfu_tf.policy.PolicyRunner`).

    The context depends on this view, never on the runner, as a Keras
    ``Callback`` receives its model and imports nothing of the trainer.
    """

    hook_step: int
    epoch: int
    samples: int
    rank: int
    size: int
    topology: str
    batch_size: int | None
    learning_rate: float | None
    access: VariableAccess

    @property
    def peers(self) -> tuple[str, ...]: ...
    @property
    def self_peer(self) -> str: ...
    @property
    def size_bounds(self) -> tuple[int, int] | None: ...
    def log_line(self, text: str, by: str = "") -> None: ...


class PolicyContext:
    """The state of training between two steps, and the adaptation functions.

    Read-only state: ``step`` (before_step: the step about to run; after_step:
    the step just run; 0-based), ``epoch``, ``samples`` (global samples trained
    so far), ``metrics`` (dict: the monitor's values and the runner's own,
    see :class:`~kungfu_tf.policy.PolicyRunner`), ``rank``, ``size``,
    ``topology``, ``batch_size`` (global), ``local_batch_size``,
    ``learning_rate`` (None without one).

    Adaptation functions record a request; the runner applies the requests
    of one hook phase together after checking that every worker asked for
    the same, so a value read back in the same hook is still the old one.
    Requests are checked at once and raise ``ValueError``/``TypeError``
    naming the argument. ``resize`` changes the number of workers (elastic
    jobs, ``kungfu-run --elastic``).

    ``metrics`` is one dict shared by the policies of a phase, in order: a
    policy may add values for the ones after it. Numbers a policy adds under
    "<policy>/<name>" (a "/" in the key) are written as TensorBoard scalars
    ``policy/<policy>/<name>`` at the end of the phase (lists: one per index).

    Cluster: ``peers`` (members "host:port" in rank order), ``self_peer``,
    ``size_bounds`` (the elastic job's --min-np/--max-np). ``log(text)`` adds
    a line to the decision log.
    """

    def __init__(self, runner: TrainingView):
        self._runner = runner
        self.metrics: dict[str, Any] = {}
        self.requests: dict[str, Any] = {}
        self.reasons: dict[str, str] = {}
        self.requested_by: dict[str, str] = {}
        self._hook: str | None = None
        self._policy: str = ""

    # --- state -------------------------------------------------------------
    @property
    def step(self) -> int:
        return self._runner.hook_step

    @property
    def epoch(self) -> int:
        return self._runner.epoch

    @property
    def samples(self) -> int:
        return self._runner.samples

    @property
    def rank(self) -> int:
        return self._runner.rank

    @property
    def size(self) -> int:
        return self._runner.size

    @property
    def topology(self) -> str:
        return self._runner.topology

    @property
    def batch_size(self) -> int | None:
        return self._runner.batch_size

    @property
    def local_batch_size(self) -> int | None:
        b = self._runner.batch_size
        return None if b is None else b // self._runner.size

    @property
    def learning_rate(self) -> float | None:
        return self._runner.learning_rate

    # --- adaptation --------------------------------------------------------
    def set_batch_size(self, batch_size: int, reason: str = "") -> None:
        """Asks for a new *global* batch size (a positive int, a multiple of ``size``).

        Each worker then trains on ``batch_size // size`` rows per step, from
        the next step. With an ``lr_rule`` the learning rate follows. The
        runner's hysteresis may refuse it (see ``history``).
        """
        if self._runner.batch_size is None:
            raise ValueError(
                "set_batch_size: this runner does not control the batch size; give it batch_size= (the initial "
                "global batch) and feed the step from kungfu_tf.data.adaptive_batch(ds, runner.local_batch_size)"
            )
        if isinstance(batch_size, (bool, np.bool_, float, np.floating)):
            raise TypeError(f"set_batch_size: batch_size must be an int, got {batch_size!r}")
        try:
            value = operator.index(batch_size)
        except TypeError:
            raise TypeError(f"set_batch_size: batch_size must be an int, got {batch_size!r}") from None
        if value <= 0:
            raise ValueError(f"set_batch_size: batch_size must be positive, got {value}")
        if value % self.size:
            raise ValueError(
                f"set_batch_size: the global batch_size {value} is not a multiple of the cluster size {self.size} "
                f"(each worker trains on batch_size // size rows); use e.g. {max(1, value // self.size) * self.size}"
            )
        self._request("batch_size", value, reason)

    def set_learning_rate(self, learning_rate: float, reason: str = "") -> None:
        """Asks for a new learning rate (a finite number > 0); it overrides the ``lr_rule`` for this change."""
        if not self._runner.access.has_learning_rate():
            raise ValueError(
                "set_learning_rate: this runner has no learning rate to set; give it the optimizer "
                "(optimizer=, or compile the Keras model with one) or learning_rate=<tf.Variable>"
            )
        if (problem := self._runner.access.learning_rate_error()) is not None:
            raise ValueError(f"set_learning_rate: {problem}")
        if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float, np.floating, np.integer)):
            raise TypeError(f"set_learning_rate: learning_rate must be a number, got {learning_rate!r}")
        value = float(learning_rate)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"set_learning_rate: learning_rate must be a finite number > 0, got {learning_rate!r}")
        self._request("learning_rate", value, reason)

    def set_topology(self, name: str, reason: str = "") -> None:
        """Asks for a new all-reduce topology (STAR, RING, BINARY_TREE, BINARY_TREE_STAR, CLIQUE, AUTO; any case)."""
        self._request("topology", topology_name(name), reason)

    def resize(self, new_size: int | None = None, reason: str = "", *, workers: Sequence[str] | None = None) -> None:
        """Asks for ``new_size`` workers (a positive int; KungFu Tab. 2 ``resize``), or for exactly ``workers``.

        Applied after the phase like the other requests (every worker must ask
        for the same), through :func:`kungfu_tf.ops.resize`: a shrink takes
        effect at once (the workers past ``new_size`` detach), a growth when
        the launcher's joiners are ready (asynchronous; the job's ``--max-np``
        bounds it). The global batch follows the cluster: each worker keeps
        its ``local_batch_size``. Only in an elastic job.

        ``workers`` (instead of ``new_size``): the current members
        ("host:port", see :attr:`peers`) to keep, in their new rank order; the
        others detach (e.g. evicting a straggler). Give exactly one of the two.

        Example:
            >>> ctx.resize(ctx.size + 1, reason="a replacement")                 # doctest: +SKIP
            >>> ctx.resize(workers=[p for p in ctx.peers if p != slow], reason="evict")  # doctest: +SKIP
        """
        if (new_size is None) == (workers is None):
            raise ValueError(
                f"resize: give exactly one of new_size and workers, got new_size={new_size!r}, workers={workers!r}"
            )
        if workers is not None:
            self._request("size", self._checked_workers(workers), reason)
            return
        if isinstance(new_size, (bool, np.bool_, float, np.floating)):
            raise TypeError(f"resize: new_size must be an int, got {new_size!r}")
        try:
            value = operator.index(new_size)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"resize: new_size must be an int, got {new_size!r}") from None
        if value <= 0:
            raise ValueError(f"resize: new_size must be positive, got {value}")
        self._request("size", value, reason)

    def _checked_workers(self, workers: Sequence[str]) -> list[str]:
        if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
            raise TypeError(f"resize: workers must be a list of 'host:port' strings, got {workers!r}")
        members = self.peers
        out: list[str] = []
        for i, w in enumerate(workers):
            if not isinstance(w, str):
                raise TypeError(f"resize: workers[{i}] must be a 'host:port' string, got {type(w).__name__} {w!r}")
            if w in out:
                raise ValueError(f"resize: workers[{i}] {w!r} appears more than once in {list(workers)!r}")
            if w not in members:
                raise ValueError(
                    f"resize: workers[{i}] {w!r} is not a member of the cluster ({', '.join(members)}); "
                    "a resize to a list can only keep or evict members (grow with resize(new_size))"
                )
            out.append(w)
        if not out:
            raise ValueError("resize: workers must name at least one worker, got an empty list")
        return out

    # --- cluster and decision log ---------------------------------------------
    @property
    def peers(self) -> tuple[str, ...]:
        """The current members as "host:port", in rank order (``peers[ctx.rank] == ctx.self_peer``).

        Outside ``kungfu-run`` a one-worker job has its own address. Keys that
        must survive membership changes (ranks move when workers join or
        leave) should use peers, not ranks.
        """
        return self._runner.peers

    @property
    def self_peer(self) -> str:
        """This worker's "host:port"."""
        return self._runner.self_peer

    @property
    def size_bounds(self) -> tuple[int, int] | None:
        """The job's ``(--min-np, --max-np)`` in an elastic job (``kungfu-run --elastic``), else None.

        A max of 0 means no upper bound (``kungfu-run`` always sets one).
        """
        return self._runner.size_bounds

    def log(self, text: str) -> None:
        """Adds ``text`` to the decision log without asking for a change.

        Like the runner's :class:`~kungfu_tf.policy.Decision` lines: kept in
        ``runner.log_lines`` (every worker), printed by rank 0 when the runner
        is verbose and written to TensorBoard text ``policy/decisions``. For
        decisions *not* to change anything and the statistics behind a decision.

        Example:
            >>> ctx.log("worker 127.0.0.1:41001 at 0.62 of the median: asking for a replacement")  # doctest: +SKIP
        """
        if not isinstance(text, str):
            raise TypeError(f"log: text must be a str, got {type(text).__name__} {text!r}")
        self._runner.log_line(text, self._policy)

    # --- communication (Tab. 2), eager, for values measured per worker ------
    def all_reduce(self, value: Any, op: str = "mean", name: str | None = None, topology: str | None = None) -> Any:
        """``value`` (a number or array) reduced over all workers, as numpy (float64 for "mean").

        ``topology``: as in :func:`kungfu_tf.ops.all_reduce` (None: the one in force).
        """
        x = np.asarray(value, np.float64 if op == "mean" else None)
        with tf.init_scope():
            return collective.all_reduce(tf.constant(x), op=op, name=name, topology=topology).numpy()

    def broadcast(self, value: Any, root: int = 0, name: str | None = None) -> Any:
        """Worker ``root``'s ``value`` (a number or array), as numpy."""
        with tf.init_scope():
            return collective.broadcast(tf.constant(np.asarray(value)), root=root, name=name).numpy()

    def all_gather(self, value: Any, name: str | None = None) -> Any:
        """Every worker's ``value`` (same shape everywhere), stacked by rank, as numpy."""
        with tf.init_scope():
            return collective.all_gather(tf.constant(np.asarray(value)), name=name).numpy()

    # --- runner side -------------------------------------------------------
    def _request(self, name: str, value: Any, reason: str) -> None:
        if self._hook is None:
            what = "resize" if name == "size" else f"set_{name}"
            raise RuntimeError(f"{what} may only be called from a policy hook, while the runner runs it")
        self.requests[name] = value
        self.requested_by[name] = self._policy
        if reason:
            self.reasons[name] = reason
