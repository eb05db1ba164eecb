"""``GradientMonitor``: gradient noise scale, gradient variance and compute time inside the training step.

Attached to :func:`~kungfu_tf.optimizers.SynchronousSGDOptimizer` with
``monitor=``, it adds C++ kernels to the step when the step is traced
(KungFu §4.2) and keeps its results and its smoothing state in TF variables,
so that checkpoints carry them and a rebuilt graph continues where the old
one stopped.

**Gradient noise scale** (McCandlish et al. 2018, "simple noise scale";
papers/taming-hyperparameters.md §4). With ``np`` workers, each computing its
gradient over ``B_small`` examples (``local_batch_size``), and the averaged
gradient standing for ``B_big = np * B_small`` examples:

* ``|G_small|^2`` = mean over workers of each worker's own squared gradient
  norm. Every worker computes its norm with one kernel over its gradient list,
  and the scalar travels *inside* the gradient all-reduce (appended to a fused
  bucket), so it costs no extra round trip;
* ``|G_big|^2`` = squared norm of the averaged gradient (computed locally,
  identical on every worker);
* unbiased estimates ``|G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)``
  and ``tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1/B_small - 1/B_big)``;
* numerator and denominator are smoothed separately with a bias-corrected
  exponential moving average (``smoothing`` is the decay; Adam's correction
  ``1 - smoothing^t``), and ``gns = ema(tr(Sigma)) / ema(|G|^2)``.

The estimator follows the cluster **as it is at each step** (the size is
read inside the step, as ``rank()``/``cluster_size()`` are): a step traced
at one size runs right at any other, without re-tracing, so a job that
grows or shrinks (``kungfu_tf.elastic``) keeps one estimate, equal on every
worker. With **one worker** there is no second batch size in a step, so the
monitor pairs each gradient with the previous step's: ``|G_small|^2`` is the mean of the two squared norms
(``B_small = B``), ``|G_big|^2`` the squared norm of their mean
(``B_big = 2B``). This assumes the parameters change little in one step (it
is exact when they do not change); it keeps a copy of the previous gradient
(one model's worth of memory) and starts estimating at the second step. The
copy remembers its batch size: the first step after ``local_batch_size``
changes has no pair (two unequal batches), the next one pairs again. The
copy is per worker and never checkpointed (in a ``tf.compat.v1`` graph it is
a local variable), so a restored or rebuilt monitor pairs from its second
step on, and a checkpoint restores whatever the cluster size was when it
was written. A step at several workers leaves no copy to pair with: after a
shrink to one worker the first step has no pair, the next one pairs. The
copy exists where the step is traced at one worker or the job is elastic.

**Elastic state.** :meth:`GradientMonitor.synced_variables` are the
variables every worker holds alike (the smoothing state, the estimates,
the step counter): ``ElasticState(model=, optimizer=)`` syncs them to
joiners with the training state. This worker's compute times and previous
gradient are per worker: never synced, compared or checkpointed.

**Gradient variance** (``variance_interval > 0``): every
``variance_interval`` steps (``tf.cond`` inside the step, no re-trace) the
workers all-reduce the squares of their gradients; the element-wise
population variance across workers ``E[g^2] - E[g]^2`` is averaged over all
elements. Off (NaN) otherwise.

**Compute time**: a clock op without inputs runs when the step starts, a
second one when the last gradient is ready; their difference is this
worker's compute time, not counting the wait for its peers. Every worker's
value rides with the same all-reduce, so ``worker_compute_times`` shows them
all (a straggler stands out although all workers see the same step time).
Eagerly (no ``tf.function``) the clock starts only when the optimizer is
called.

**Cost per step.** The bookkeeping is three ops whatever the model: the
clock's start, one kernel before the all-reduce (clock, norm, rider, made in
the dtype it travels in) and one after it that updates the estimate and
writes every variable above itself (ops.monitor.local_statistics and
update_monitor); the gradient variance adds its ``tf.cond`` when enabled.
Built from single-purpose ops it took ~50-95, a fixed ~0.09 ms per step
(docs/guide/benchmarks.md, "Monitoring overhead").

Example:
    >>> import keras
    >>> import tensorflow as tf
    >>> from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer
    >>> monitor = GradientMonitor(batch_size=32, variance_interval=8)
    >>> opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), monitor=monitor)
    >>> opt.kungfu_monitor is monitor
    True
    >>> sorted(monitor.values())[:3]
    ['compute_time', 'gns', 'gns_raw']
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from kungfu_tf import ops
from kungfu_tf.ops import monitor as monitor_ops
from kungfu_tf.ops.call_names import call_prefix

Gradient = tf.Tensor | tf.IndexedSlices | None

FLOAT_KEYS = ("gns", "gns_raw", "noise_trace", "grad_sq_norm", "grad_variance", "compute_time")


@dataclass
class LocalStatistics:
    """What a worker measures before the all-reduce; ``rider`` travels with the gradients.

    ``rider`` is ``[1 + np]``, float32 or float64 (see ``_rider_dtype``): this worker's squared gradient norm,
    then its compute time at its own rank's position (zeros elsewhere), so
    that the *mean* over workers yields the mean squared norm and, times np,
    every worker's compute time.
    """

    rider: tf.Tensor
    compute_time: tf.Tensor
    size: tf.Tensor  # cluster size (int32) at run time


def _per_worker_variable(initial_value: Any, name: str, dtype: tf.DType | None = None) -> tf.Variable:
    """A variable that no checkpoint may hold: it describes this worker's last step, not the training state.

    Held by plain objects (below), which neither ``tf.Module`` nor
    ``tf.train.Checkpoint`` track. In a ``tf.compat.v1`` graph it goes to
    ``LOCAL_VARIABLES`` instead of ``GLOBAL_VARIABLES``, so that a ``Saver``
    (``MonitoredTrainingSession``'s included) neither saves nor expects it --
    a checkpoint written by a cluster whose graph lacks it restores into one
    that has it -- and the local init op (``MonitoredTrainingSession``'s, or
    ``tf.compat.v1.local_variables_initializer()``) initializes it.
    """
    if tf.compat.v1.executing_eagerly_outside_functions():
        return mark_per_worker(tf.Variable(initial_value, dtype=dtype, trainable=False, name=name))
    return mark_per_worker(tf.compat.v1.Variable(
        initial_value, dtype=dtype, trainable=False, name=name,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES], use_resource=True,
    ))  # fmt: skip


PER_WORKER = "_kungfu_per_worker"


def mark_per_worker(variable: tf.Variable) -> tf.Variable:
    """Marks a variable whose value differs between workers by design (``kungfu_tf.elastic`` neither syncs nor compares it)."""
    setattr(variable, PER_WORKER, True)
    return variable


def is_per_worker(variable: object) -> bool:
    """True for a variable :func:`mark_per_worker` marked (a monitor's compute time, its previous gradient)."""
    return bool(getattr(variable, PER_WORKER, False))


class _Untracked:
    """Per-worker variables no checkpoint should hold: a plain object, which ``tf.Module`` does not track."""

    def __init__(self) -> None:
        # The step clock's anchor: a resource nothing else uses (see ops.monitor.step_clock_start).
        self.clock_anchor = _per_worker_variable(0, "step_clock_anchor", tf.int32)
        # The update kernel's variables as one packed tensor (ops.monitor.variable_handles), made once.
        self.state_handles: tf.Tensor | None = None


class _PreviousGradient:
    """The one-worker method's copy of the last gradient and its batch size: per worker, never checkpointed.

    A plain object (not trackable), so that ``tf.Module`` and checkpoints do
    not see these variables: a restored monitor pairs from its next step on.
    ``batch_size`` is the per-worker batch size the copy was computed with,
    0 before the first step: a step pairs only with a copy of its own batch
    size (the estimator assumes two equal batches).
    """

    def __init__(self, grads: Sequence[tf.Tensor]) -> None:
        with tf.init_scope():
            self.tensors = [_per_worker_variable(tf.zeros(g.shape, g.dtype), "previous_gradient") for g in grads]
            self.batch_size = _per_worker_variable(0, "previous_batch_size", tf.int64)


class GradientMonitor(tf.Module):
    """Gradient noise scale, gradient variance and per-worker compute time, updated inside each step.

    Args:
        batch_size: the per-worker batch size the gradient noise scale
            assumes (``local_batch_size``; the policy runner reassigns it when
            the batch size changes). An int > 0.
        gns: estimate the gradient noise scale.
        smoothing: decay of the bias-corrected exponential moving averages, in
            [0, 1); 0 means no smoothing.
        variance_interval: compute the gradient variance across workers every
            this many steps (one extra all-reduce of the gradients' squares on
            those steps); 0 turns it off.
        name: name of the module (and prefix of its variables).

    Attributes:
        local_batch_size: int64 scalar variable, read by the step at run time.
        tensors: the monitored values as variables, updated by the step:
            "gns", "gns_raw", "noise_trace", "grad_sq_norm", "grad_variance",
            "compute_time" (float64 scalars), "worker_compute_times" (float64
            [np]), "monitor_step" (int64). NaN until first estimated.

    In a ``tf.compat.v1`` graph the per-worker variables (the step clock's
    anchor, the one-worker previous gradient) are local variables:
    ``MonitoredTrainingSession`` initializes them; with a plain ``Session``
    run ``tf.compat.v1.local_variables_initializer()`` as well.

    Raises:
        TypeError / ValueError: an argument of the wrong type or out of range
            (the message names it and the value).

    Example:
        >>> m = GradientMonitor(batch_size=64, smoothing=0.95)
        >>> int(m.local_batch_size.numpy()), m.values()["monitor_step"]
        (64, 0)
        >>> tf.train.Checkpoint(monitor=m)  # its state is checkpointed  # doctest: +ELLIPSIS
        <...Checkpoint object at ...>
    """

    def __init__(
        self,
        batch_size: int,
        gns: bool = True,
        smoothing: float = 0.9,
        variance_interval: int = 0,
        name: str = "kungfu_monitor",
    ) -> None:
        _check_positive_int(batch_size, "batch_size")
        if not isinstance(gns, bool):
            raise TypeError(f"GradientMonitor: gns must be a bool, got {gns!r}")
        if isinstance(smoothing, bool) or not isinstance(smoothing, numbers.Real) or not 0.0 <= smoothing < 1.0:
            raise ValueError(f"GradientMonitor: smoothing must be a number in [0, 1), got {smoothing!r}")
        if isinstance(variance_interval, bool) or not isinstance(variance_interval, numbers.Integral):
            raise TypeError(f"GradientMonitor: variance_interval must be an int >= 0, got {variance_interval!r}")
        if variance_interval < 0:
            raise ValueError(f"GradientMonitor: variance_interval must be >= 0 (0: off), got {variance_interval!r}")
        super().__init__(name=name)
        self.gns_enabled = gns
        self.smoothing = float(smoothing)
        self.variance_interval = int(variance_interval)
        import kungfu_tf

        nan = float("nan")
        with tf.init_scope(), tf.name_scope(name):
            self.local_batch_size = tf.Variable(int(batch_size), dtype=tf.int64, trainable=False, name="local_batch_size")
            self.tensors = {key: tf.Variable(nan, dtype=tf.float64, trainable=False, name=key) for key in FLOAT_KEYS}
            mark_per_worker(self.tensors["compute_time"])
            self.tensors["worker_compute_times"] = tf.Variable(
                tf.fill([kungfu_tf.size()], tf.constant(nan, tf.float64)),
                dtype=tf.float64,
                shape=tf.TensorShape([None]),  # the cluster may resize
                trainable=False,
                name="worker_compute_times",
            )
            mark_per_worker(self.tensors["worker_compute_times"])  # its length is the cluster size
            self.tensors["monitor_step"] = tf.Variable(0, dtype=tf.int64, trainable=False, name="monitor_step")
            # Uncorrected EMAs of the two estimates and how many updates they hold.
            self.ema_noise_trace = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="ema_noise_trace")
            self.ema_grad_sq_norm = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="ema_grad_sq_norm")
            self.ema_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="ema_count")
            self._untracked = _Untracked()
        self._previous: Any = None  # _PreviousGradient, made when a one-worker step is traced
        self._owner: Any = None

    # ------------------------------------------------------------ outside the step

    def values(self, session: Any = None) -> dict[str, float | int | list[float]]:
        """The monitored values as Python numbers (``worker_compute_times``: a list).

        Eagerly (TF2) the variables are read directly; for a ``tf.compat.v1``
        graph pass the ``session`` (default: the default session).

        Example:
            >>> GradientMonitor(batch_size=8).values()["gns"]
            nan
        """
        if session is None and not _is_graph_variable(self.local_batch_size):
            fetched = {k: v.numpy() for k, v in self.tensors.items()}
        else:
            session = session or tf.compat.v1.get_default_session()
            if session is None:
                raise RuntimeError(
                    f"GradientMonitor {self.name!r}: its variables live in a tf.compat.v1 graph; "
                    "pass the session: values(session=...)"
                )
            fetched = session.run(dict(self.tensors))
        out: dict[str, float | int | list[float]] = {}
        for key, value in fetched.items():
            if key == "monitor_step":
                out[key] = int(value)
            elif key == "worker_compute_times":
                out[key] = [float(x) for x in value]
            else:
                out[key] = float(value)
        return out

    def synced_variables(self) -> list[tf.Variable]:
        """The variables every worker holds alike: what an elastic state syncs to joiners (see the module docstring).

        Example:
            >>> [v.name for v in GradientMonitor(batch_size=8).synced_variables()][:2]
            ['kungfu_monitor/local_batch_size:0', 'kungfu_monitor/gns:0']
        """
        shared = [v for k, v in self.tensors.items() if not is_per_worker(v)]
        return [self.local_batch_size, *shared, self.ema_noise_trace, self.ema_grad_sq_norm, self.ema_count]

    def attach(self, owner: Any) -> None:
        """Binds this monitor to one optimizer; a second one is refused (it would update it twice per step)."""
        if self._owner is not None and self._owner is not owner:
            raise ValueError(
                f"GradientMonitor {self.name!r} is already attached to another optimizer; give each optimizer its own"
            )
        self._owner = owner

    # ---------------------------------------------------------------- in the step

    def local_statistics(self, grads: Sequence[Gradient]) -> LocalStatistics:
        """This worker's squared gradient norm and compute time, packed as the all-reduce rider.

        Two ops: the clock's start, and one kernel that stops the clock,
        takes the norm and lays out the rider (ops.monitor.local_statistics).
        """
        self._check_graph()
        present = [g for g in grads if g is not None]
        start = monitor_ops.step_clock_start(self._untracked.clock_anchor)
        if self.gns_enabled:
            # Whatever the size at tracing: a step traced alone (a joiner's
            # warm-up) later runs in a cluster, whose mean needs this norm.
            # (For tf.IndexedSlices the clock then stops after their duplicate
            # rows are summed, a small part of the norm's work.)
            measured = [_norm_operand(g) for g in present]
        else:
            measured = [g.values if isinstance(g, tf.IndexedSlices) else g for g in present]
        rider, compute_time, size = monitor_ops.local_statistics(
            start, measured, with_norm=self.gns_enabled, rider_dtype=_rider_dtype(present)
        )
        return LocalStatistics(rider=rider, compute_time=compute_time, size=size)

    def update(
        self,
        local: LocalStatistics,
        reduced_rider: tf.Tensor,
        local_grads: Sequence[Gradient],
        averaged_grads: Sequence[Gradient],
        name: str,
    ) -> tf.Operation | None:
        """Updates every monitored variable from this step's gradients; returns the op doing it (None eagerly).

        ``reduced_rider`` is ``local.rider`` averaged over the workers (by the
        gradient all-reduce); ``local_grads`` and ``averaged_grads`` pair up
        position by position. One kernel writes every variable
        (ops.monitor.update_monitor); the gradient variance, when due, runs
        before it in a ``tf.cond`` with its own all-reduce.
        """
        prefix = call_prefix(f"{name}/monitor")
        pairs = [(g, a) for g, a in zip(local_grads, averaged_grads) if g is not None and a is not None]
        local_present = [g for g, _ in pairs]
        before: list[Any] = []
        if self.variance_interval > 0:
            step = self.tensors["monitor_step"].read_value()
            variance = self._update_variance(step, local_present, [a for _, a in pairs], prefix)
            if variance is not None:
                before.append(variance)
        averaged: list[Any] = []
        current: list[Any] = []
        previous: list[tf.Variable] = []
        if self.gns_enabled:
            averaged = [_norm_operand(a) for _, a in pairs]
            copy = self._previous_gradient(local_present)
            if copy is not None:
                current = _pair_operands(local_present, local.size)
                previous = [*copy.tensors, copy.batch_size]
        # In a v1 graph nothing orders the variance's read of monitor_step
        # before this kernel's increment but this dependency.
        with tf.control_dependencies(before):
            return monitor_ops.update_monitor(
                reduced_rider, local.compute_time, local.size, averaged, current, self._state_handles(), previous,
                gns=self.gns_enabled, smoothing=self.smoothing,
            )  # fmt: skip

    def _state_handles(self) -> tf.Tensor:
        """The variables the update kernel writes, packed once: a traced step captures one input, not eleven."""
        if self._untracked.state_handles is None:
            state = [self.tensors[key] for key in ("compute_time", "worker_compute_times", "monitor_step")]
            if self.gns_enabled:
                state += [self.local_batch_size, self.ema_noise_trace, self.ema_grad_sq_norm, self.ema_count]
                state += [self.tensors[key] for key in ("noise_trace", "grad_sq_norm", "gns", "gns_raw")]
            self._untracked.state_handles = monitor_ops.variable_handles(state)
        return self._untracked.state_handles

    def _update_variance(self, step: tf.Tensor, local: list[Any], averaged: list[Any], prefix: str) -> Any:
        variance = self.tensors["grad_variance"]

        def measure() -> tf.Tensor:
            dense_local = [_dense(g) for g in local]
            square_means = ops.group_all_reduce(monitor_ops.squares(dense_local), op="mean", name=f"{prefix}/variance")
            return monitor_ops.mean_variance(square_means, [_dense(a) for a in averaged])

        if not local:
            return None
        due = tf.equal(step % self.variance_interval, 0)
        # Every worker takes the same branch: the step counter is the same everywhere.
        return variance.assign(tf.cond(due, measure, variance.read_value))

    def _previous_gradient(self, local: list[Any]) -> _PreviousGradient | None:
        """The copy of the last one-worker gradient, made where the step may run at one worker:
        traced at one, or in an elastic job (which may shrink to one). None otherwise (no copy's memory)."""
        if self._previous is None and (_traced_for_one_worker() or _elastic_job()):
            self._previous = _PreviousGradient([_dense(g) for g in local])
        return self._previous

    def _check_graph(self) -> None:
        """Refuses a step traced in another graph than the one holding the monitor's variables."""
        step_graph = _outermost_graph()
        in_v1_graph = step_graph is not None
        if _is_graph_variable(self.local_batch_size):
            if self.local_batch_size.graph is not step_graph:
                raise ValueError(
                    f"GradientMonitor {self.name!r} was created in another tf.compat.v1 graph than the training "
                    "step; create it inside the graph that trains (under graph.as_default())"
                )
        elif in_v1_graph:
            raise ValueError(
                f"GradientMonitor {self.name!r} was created eagerly but the training step is a tf.compat.v1 "
                "graph; create the monitor inside that graph (under graph.as_default())"
            )


def _check_positive_int(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"GradientMonitor: {what} must be an int > 0, got {value!r}")
    if value <= 0:
        raise ValueError(f"GradientMonitor: {what} must be > 0, got {value!r}")


def _traced_for_one_worker() -> bool:
    """True if the step being traced runs on one worker (the GNS then pairs successive gradients)."""
    import kungfu_tf

    return kungfu_tf.size() == 1


def _elastic_job() -> bool:
    """True in a ``kungfu-run --elastic`` job (the cluster may change size while the step runs)."""
    from kungfu_tf.ops import elastic_membership

    return elastic_membership.is_elastic()


def _is_graph_variable(v: tf.Variable) -> bool:
    """True if ``v`` was created in a tf.compat.v1 graph (not eagerly)."""
    return bool(getattr(v, "_in_graph_mode", False))


def _outermost_graph() -> tf.Graph | None:
    """The tf.compat.v1 graph being built, seen through cond/while bodies; None when eager or in a tf.function."""
    if tf.compat.v1.executing_eagerly_outside_functions():
        return None
    graph = tf.compat.v1.get_default_graph()
    while isinstance(graph, tf.__internal__.FuncGraph) and graph.outer_graph is not None:
        graph = graph.outer_graph
    return graph


def _rider_dtype(grads: Sequence[Any]) -> tf.DType:
    """The dtype the rider is made in: the one the gradient all-reduce would cast it to, so it needs no cast.

    The all-reduce carries the rider in a dense gradient's float32 collective
    unless that gradient is float64, or alone as float64 without a dense
    gradient (optimizers.gradient_sync, strategy.compiler). float32 is safe
    only where every such choice is float32: no float64 gradient and a dense
    one. Elsewhere float64, which the all-reduce casts as it did before.
    """
    if any(g.dtype == tf.float64 for g in grads) or not any(isinstance(g, tf.Tensor) for g in grads):
        return tf.float64
    return tf.float32


def _pair_operands(local: Sequence[Any], size: tf.Tensor) -> list[tf.Tensor]:
    """The gradients the one-worker estimate pairs with the previous ones: dense, as the copies are.

    A dense gradient is passed as it is. A ``tf.IndexedSlices`` is made dense
    only when the step runs at one worker (a ``tf.cond`` on the size): at
    several workers the kernel does not read it, and densifying an
    embedding's gradient every step would cost a whole table's worth.
    """
    sparse = [i for i, g in enumerate(local) if isinstance(g, tf.IndexedSlices)]
    out = [None if isinstance(g, tf.IndexedSlices) else _dense(g) for g in local]
    if sparse:

        def densified() -> list[tf.Tensor]:
            return [_dense(local[i]) for i in sparse]

        def unused() -> list[tf.Tensor]:
            return [tf.zeros([0], local[i].dtype) for i in sparse]

        filled = tf.cond(size > 1, unused, densified)
        for i, t in zip(sparse, filled if isinstance(filled, (list, tuple)) else [filled]):
            out[i] = t
    return out  # type: ignore[return-value]


def _dense(g: Any) -> tf.Tensor:
    return tf.convert_to_tensor(g)


def _norm_operand(g: Any) -> tf.Tensor:
    """What the squared norm of ``g`` is taken over: the tensor, or a slice's values with duplicate rows summed.

    ``tf.IndexedSlices`` may hold one row several times (a token seen twice);
    the gradient is their sum, so the rows are combined before squaring.
    """
    if not isinstance(g, tf.IndexedSlices):
        return tf.convert_to_tensor(g)
    unique, position = tf.unique(g.indices)
    return tf.math.unsorted_segment_sum(g.values, position, tf.size(unique))


__all__ = ["GradientMonitor", "LocalStatistics", "is_per_worker", "mark_per_worker"]
