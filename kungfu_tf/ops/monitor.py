"""Monitoring ops: communication counters, gradient statistics and the step clock.

The gradient statistics take whole lists of gradients and run as one C++
kernel each (sums accumulated in float64), so monitoring a model adds a few
ops per step, not a few per variable. :class:`kungfu_tf.optimizers.GradientMonitor`
uses two fused kernels per step: :func:`local_statistics` before the gradient
all-reduce (clock, norm, rider) and :func:`update_monitor` after it, which
updates the estimate and writes the monitor's variables itself -- with the
clock's start, three ops instead of the ~50-95 small ops (reads, assigns,
slices, casts, a cond) whose fixed cost per step showed on small models.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.ops import monitor
    >>> monitor.comm_rates().shape  # one rate per worker
    TensorShape([1])
    >>> sent, received = monitor.comm_bytes()  # totals per worker
    >>> sent.numpy()
    array([0])
    >>> float(monitor.squared_norm([tf.constant([3.0]), tf.constant([[4.0]], tf.float16)]))
    25.0
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import tensorflow as tf

# TensorFlow's hook for ops whose resources are not their direct inputs
# (its own Identity and function-call ops use it): a tf.function orders the
# ops that touch one resource, and only sees the resources an op takes.
from tensorflow.python.framework import auto_control_deps

from kungfu_tf._native import library

FLOAT_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def comm_rates() -> tf.Tensor:
    """float64 [np]: bytes/s exchanged with each peer since the previous call (0 for self)."""
    return library().kungfu_comm_rates()


def comm_bytes() -> tuple[tf.Tensor, tf.Tensor]:
    """int64 ([np], [np]): total bytes sent to and received from each peer (frame headers included; 0 for self).

    Totals since the current cluster version began (the runtime's start,
    unless the cluster changed: membership.update_cluster starts new
    connections), so the difference across an operation is the traffic it
    caused (when nothing else runs meanwhile).
    """
    both = library().kungfu_comm_bytes()
    return both[0], both[1]


def _float_tensors(xs: Sequence[tf.Tensor], what: str) -> list[tf.Tensor]:
    out = [tf.convert_to_tensor(x) for x in xs]
    for i, x in enumerate(out):
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{what}: tensor {i} must be float16, bfloat16, float32 or float64, got {x.dtype.name}")
    return out


def _paired(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor], what: str, names: tuple[str, str]) -> tuple[list, list]:
    a, b = _float_tensors(a, f"{what} {names[0]}"), _float_tensors(b, f"{what} {names[1]}")
    if len(a) != len(b):
        raise ValueError(f"{what}: {names[0]} has {len(a)} tensors, {names[1]} {len(b)}; they must pair up")
    for i, (x, y) in enumerate(zip(a, b)):
        if x.dtype != y.dtype:
            raise TypeError(f"{what}: tensor {i} is {x.dtype.name} in {names[0]} but {y.dtype.name} in {names[1]}")
    return a, b


def squared_norm(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """float64 scalar: the squared L2 norm of all ``tensors`` together (sum of every element's square).

    Example:
        >>> import tensorflow as tf
        >>> float(squared_norm([tf.ones([2, 2]), tf.fill([1], 2.0)]))
        8.0
    """
    return library().kungfu_squared_norm(_float_tensors(tensors, "squared_norm"))


def pair_squared_norms(current: Sequence[tf.Tensor], previous: Sequence[tf.Tensor]) -> tf.Tensor:
    """float64 [3]: ``[|current|^2, |previous|^2, |(current + previous) / 2|^2]`` in one pass.

    Both lists must pair up (same length, dtypes and shapes).

    Example:
        >>> import tensorflow as tf
        >>> pair_squared_norms([tf.constant([1.0, 0.0])], [tf.constant([0.0, 1.0])]).numpy().tolist()
        [1.0, 1.0, 0.5]
    """
    a, b = _paired(current, previous, "pair_squared_norms", ("current", "previous"))
    return library().kungfu_pair_squared_norms(a, b)


def mean_variance(square_means: Sequence[tf.Tensor], means: Sequence[tf.Tensor]) -> tf.Tensor:
    """float64 scalar: mean over all elements of ``max(square_means - means**2, 0)``.

    Given the across-worker mean of each gradient element's square and of the
    element itself, this is the element-wise population variance across
    workers (numpy's ``var(axis=0)``), averaged over every element. NaN for
    empty lists.

    Example:
        >>> import tensorflow as tf
        >>> float(mean_variance([tf.constant([5.0, 1.0])], [tf.constant([2.0, 1.0])]))  # (1 + 0) / 2
        0.5
    """
    a, b = _paired(square_means, means, "mean_variance", ("square_means", "means"))
    return library().kungfu_mean_variance(a, b)


def step_clock_start(anchor: tf.Variable) -> tf.Tensor:
    """int64 scalar: the monotonic clock (ns) when this op ran.

    Its only input is ``anchor``'s resource handle, never read: give it a
    variable that nothing else in the step uses. Then in a ``tf.function`` or
    a ``Session.run`` it runs as soon as the step starts (eagerly: when
    called), not after the stateful ops traced before it (see
    ops/kernels/step_clock_kernels.cc).
    """
    return library().kungfu_step_clock_start(anchor.handle)


def step_clock_lap(start_ns: tf.Tensor, ready: Sequence[tf.Tensor]) -> tf.Tensor:
    """float64 scalar: seconds from ``start_ns`` until every tensor in ``ready`` was available.

    Example:
        >>> import tensorflow as tf
        >>> t0 = step_clock_start(tf.Variable(0))
        >>> float(step_clock_lap(t0, [tf.ones([2])])) >= 0.0
        True
    """
    return library().kungfu_step_clock_lap(start_ns, [tf.convert_to_tensor(x) for x in ready])


def gns_estimates(
    small_sq_norm: tf.Tensor, big_sq_norm: tf.Tensor, small_batch: tf.Tensor, big_batch: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Unbiased ``(|G|^2, tr(Sigma))`` from two batch sizes (McCandlish et al. 2018, App. A.1).

    ``small_sq_norm`` is ``E|g|^2`` of gradients over ``small_batch`` examples,
    ``big_sq_norm`` that of ``big_batch`` examples (``big_batch > small_batch``)::

        |G|^2     = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)
        tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)

    Their ratio ``tr(Sigma) / |G|^2`` is the simple noise scale B_simple. All
    float64 scalars.

    Example:
        >>> import tensorflow as tf
        >>> g2, trace = gns_estimates(tf.constant(3.0, tf.float64), tf.constant(2.0, tf.float64), 1, 2)
        >>> float(g2), float(trace)
        (1.0, 2.0)
    """
    s = tf.cast(small_batch, tf.float64)
    b = tf.cast(big_batch, tf.float64)
    small_sq_norm = tf.cast(small_sq_norm, tf.float64)
    big_sq_norm = tf.cast(big_sq_norm, tf.float64)
    grad_sq = (b * big_sq_norm - s * small_sq_norm) / (b - s)
    trace = (small_sq_norm - big_sq_norm) / (1.0 / s - 1.0 / b)
    return grad_sq, trace


def squares(tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
    """The element-wise square of every tensor, each in its own dtype, as one op.

    Example:
        >>> import tensorflow as tf
        >>> squares([tf.constant([-2.0, 3.0])])[0].numpy().tolist()
        [4.0, 9.0]
    """
    xs = _float_tensors(tensors, "squares")
    return list(library().kungfu_squares(xs)) if xs else []


def gns_update(
    small_sq_norm: tf.Tensor,
    big_sq_norm: tf.Tensor,
    small_batch: tf.Tensor,
    big_batch: tf.Tensor,
    valid: tf.Tensor,
    ema_noise_trace: tf.Tensor,
    ema_grad_sq_norm: tf.Tensor,
    ema_count: tf.Tensor,
    smoothing: float,
) -> dict[str, tf.Tensor]:
    """One step of the smoothed gradient noise scale, as one kernel.

    The estimates of :func:`gns_estimates` are folded into exponential moving
    averages with decay ``smoothing`` (skipped when ``valid`` is False or an
    estimate is not finite), then bias-corrected. Returns the new state
    ("ema_noise_trace", "ema_grad_sq_norm", "ema_count") and "noise_trace",
    "grad_sq_norm", "gns" (their ratio) and "gns_raw" (this step's ratio).

    Example:
        >>> import tensorflow as tf
        >>> f64 = lambda v: tf.constant(v, tf.float64)
        >>> out = gns_update(f64(5.0), f64(3.0), f64(4.0), f64(12.0), True, f64(0.0), f64(0.0), tf.constant(0, tf.int64), 0.5)
        >>> [round(float(out[k]), 9) for k in ("grad_sq_norm", "noise_trace", "gns")], int(out["ema_count"])
        ([2.0, 12.0, 6.0], 1)
    """
    f64 = [tf.cast(x, tf.float64) for x in (small_sq_norm, big_sq_norm, small_batch, big_batch)]
    outputs = library().kungfu_gns_update(
        *f64,
        tf.convert_to_tensor(valid, tf.bool),
        tf.cast(ema_noise_trace, tf.float64),
        tf.cast(ema_grad_sq_norm, tf.float64),
        tf.cast(ema_count, tf.int64),
        smoothing=float(smoothing),
    )
    keys = ("ema_noise_trace", "ema_grad_sq_norm", "ema_count", "noise_trace", "grad_sq_norm", "gns", "gns_raw")
    return dict(zip(keys, outputs))


def local_statistics(
    start_ns: tf.Tensor, gradients: Sequence[tf.Tensor], with_norm: bool, rider_dtype: tf.DType = tf.float64
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """What a worker measures before the gradient all-reduce, as one kernel: ``(rider, compute_time, size)``.

    ``compute_time`` (float64) is the time from ``start_ns`` (a
    :func:`step_clock_start`) until every tensor of ``gradients`` was
    available. ``rider`` (``[1 + size]`` of ``rider_dtype``, float32 or
    float64: the dtype it will travel in, so it needs no cast) holds the
    squared norm of ``gradients`` (0 unless ``with_norm``), then
    ``compute_time`` at this worker's rank and zeros elsewhere: averaged over
    the workers it gives the mean squared norm and, times ``size``, every
    worker's compute time. ``size`` (int32) is the cluster size the rider
    was laid out for.

    Example:
        >>> import tensorflow as tf
        >>> rider, seconds, size = local_statistics(step_clock_start(tf.Variable(0)), [tf.constant([3.0, 4.0])], True)
        >>> float(rider[0]), int(size), float(rider[1]) == float(seconds)
        (25.0, 1, True)
    """
    rider_dtype = tf.as_dtype(rider_dtype)
    if rider_dtype not in (tf.float32, tf.float64):
        raise TypeError(f"local_statistics: rider_dtype must be float32 or float64, got {rider_dtype.name}")
    return tuple(
        library().kungfu_monitor_local(
            start_ns, _float_tensors(gradients, "local_statistics"), R=rider_dtype, with_norm=bool(with_norm)
        )
    )


# id() of a packed handle vector (variable_handles) -> the handles it packs,
# for the resolver below; an entry goes with its vector (tensors are not
# hashable, and a weakref.finalize drops the entry before its id is reused).
_packed_handles: dict[int, list[tf.Tensor]] = {}


@auto_control_deps.register_acd_resource_resolver
def _packed_state_resolver(op: tf.Operation, reads: set, writes: set) -> bool:
    """Makes a traced KungfuMonitorUpdate write the variables packed in its ``state``.

    So that a read of a monitored variable later in the same step (captured
    there anyway) still runs after the update, as when the kernel took the
    variables one by one; variables the step does not touch stay uncaptured.
    """
    if op.type != "KungfuMonitorUpdate" or not hasattr(op.graph, "captures"):
        return False
    outer = {id(internal): external for external, internal in op.graph.captures}
    inner = {id(external): internal for external, internal in op.graph.captures}
    added = False
    for t in op.inputs:
        external = outer.get(id(t))
        for handle in _packed_handles.get(id(external), ()) if external is not None else ():
            internal = inner.get(id(handle))
            if internal is not None and internal not in writes:
                writes.add(internal)
                added = True
    return added


def variable_handles(variables: Sequence[tf.Variable]) -> tf.Tensor:
    """The resource handles of ``variables`` packed into one vector, made outside any ``tf.function``.

    Pass it as :func:`update_monitor`'s ``state``: a traced step then
    captures one input for all of them. Each captured variable is one more
    input that every call of the step passes in Python (a few microseconds:
    eleven of them were most of the monitor's cost on a 0.7 ms step). Made
    under ``tf.init_scope``: eagerly once in TF2, once in the graph of a
    ``tf.compat.v1`` model. The variables stay what they are (checkpoints and
    elastic syncs see no difference); the kernel writes into them.

    Example:
        >>> import tensorflow as tf
        >>> packed = variable_handles([tf.Variable(1.0), tf.Variable([2, 3])])
        >>> packed.dtype, packed.shape
        (tf.resource, TensorShape([2]))
    """
    with tf.init_scope():
        handles = [v.handle for v in variables]
        packed = tf.stack(handles)
        if tf.executing_eagerly():
            _packed_handles[id(packed)] = handles
            weakref.finalize(packed, _packed_handles.pop, id(packed), None)
        return packed


def update_monitor(
    reduced_rider: tf.Tensor,
    compute_time: tf.Tensor,
    size: tf.Tensor,
    averaged: Sequence[tf.Tensor],
    current: Sequence[tf.Tensor],
    state: Sequence[tf.Variable] | tf.Tensor,
    previous: Sequence[tf.Variable],
    gns: bool,
    smoothing: float,
) -> tf.Operation | None:
    """Everything a gradient monitor updates after the all-reduce, as one kernel writing the variables itself.

    ``state`` are the monitor's variables in the order ``compute_time``,
    ``worker_compute_times``, ``monitor_step`` and, with ``gns``,
    ``local_batch_size``, ``ema_noise_trace``, ``ema_grad_sq_norm``,
    ``ema_count``, ``noise_trace``, ``grad_sq_norm``, ``gns``, ``gns_raw``
    (or their :func:`variable_handles`, which a traced step should use).
    ``reduced_rider`` is :func:`local_statistics`' rider averaged over the
    workers (float32 or float64), ``averaged`` the averaged gradients (the squared norm of the
    big batch). In a cluster of one, ``current`` (this step's gradients)
    pairs with ``previous`` (their copies from the last step, then the int64
    batch size they had) as in :func:`pair_squared_norms`, and replaces
    them; without ``previous`` a one-worker step estimates nothing. The
    estimate is :func:`gns_update`'s, ``monitor_step`` is incremented last.
    Returns the op (None eagerly, where it has run).

    Example:
        >>> import tensorflow as tf
        >>> f64 = lambda v: tf.Variable(v, dtype=tf.float64)
        >>> state = [f64(0.0), tf.Variable([0.0], dtype=tf.float64, shape=[None]), tf.Variable(0, dtype=tf.int64)]
        >>> update_monitor(tf.constant([0.0, 0.5], tf.float64), tf.constant(0.5, tf.float64), tf.constant(1),
        ...                [], [], state, [], gns=False, smoothing=0.9)
        >>> float(state[0].numpy()), int(state[2].numpy())
        (0.5, 1)
    """
    handles = state if isinstance(state, tf.Tensor) else None
    if handles is None:
        count = len(list(state))
    else:
        count = handles.shape[0] if handles.shape.rank == 1 and handles.shape[0] is not None else -1
    previous = list(previous)
    want = 11 if gns else 3
    if count != want:
        raise ValueError(f"update_monitor: state must hold {want} variables {'with' if gns else 'without'} gns, "
                         f"got {count}")  # fmt: skip
    if handles is None:
        handles = variable_handles(list(state))
    current = _float_tensors(current, "update_monitor current")
    if previous and len(previous) != len(current) + 1:
        raise ValueError(
            f"update_monitor: {len(current)} current gradients need {len(current) + 1} previous variables "
            f"(one copy each, then the batch size), got {len(previous)}"
        )
    reduced_rider = tf.convert_to_tensor(reduced_rider)
    if reduced_rider.dtype not in (tf.float32, tf.float64):
        reduced_rider = tf.cast(reduced_rider, tf.float64)
    op = library().kungfu_monitor_update(
        reduced_rider,
        tf.convert_to_tensor(compute_time, tf.float64),
        tf.convert_to_tensor(size, tf.int32),
        _float_tensors(averaged, "update_monitor averaged"),
        current,
        handles,
        [v.handle for v in previous],
        num_state=want,
        gns=bool(gns),
        smoothing=float(smoothing),
    )
    return None if tf.executing_eagerly() else op
