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
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from kungfu_tf.ops import collective
from kungfu_tf.ops.config import topology_name

if TYPE_CHECKING:
    from kungfu_tf.policy.runner import PolicyRunner


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
    policy may add values for the ones after it.
    """

    def __init__(self, runner: PolicyRunner):
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

    def resize(self, new_size: int, reason: str = "") -> None:
        """Asks for ``new_size`` workers (a positive int; KungFu Tab. 2 ``resize``).

        Applied after the phase like the other requests (every worker must ask
        for the same), through :func:`kungfu_tf.ops.resize`: a shrink takes
        effect at once (the workers past ``new_size`` detach), a growth when
        the launcher's joiners are ready (asynchronous; the job's ``--max-np``
        bounds it). The global batch follows the cluster: each worker keeps
        its ``local_batch_size``. Only in an elastic job.
        """
        if isinstance(new_size, (bool, np.bool_, float, np.floating)):
            raise TypeError(f"resize: new_size must be an int, got {new_size!r}")
        try:
            value = operator.index(new_size)
        except TypeError:
            raise TypeError(f"resize: new_size must be an int, got {new_size!r}") from None
        if value <= 0:
            raise ValueError(f"resize: new_size must be positive, got {value}")
        self._request("size", value, reason)

    # --- communication (Tab. 2), eager, for values measured per worker ------
    def all_reduce(self, value: Any, op: str = "mean", name: str | None = None) -> Any:
        """``value`` (a number or array) reduced over all workers, as numpy (float64 for "mean")."""
        x = np.asarray(value, np.float64 if op == "mean" else None)
        with tf.init_scope():
            return collective.all_reduce(tf.constant(x), op=op, name=name).numpy()

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
