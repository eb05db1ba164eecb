"""The metrics a policy reads in ``ctx.metrics``: the runner's parameters, the step's times, the monitor's values.

Reading the monitor and the link rates costs eager ops, so the runner asks
for :func:`light_metrics` after every step and for :func:`step_metrics`
only in a phase where a policy runs or the TensorBoard log writes.
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from kungfu_tf.ops import monitor
from kungfu_tf.policy.variable_access import VariableAccess


def parameters(size: int, topology: str, batch_size: int | None, learning_rate: float | None) -> dict[str, Any]:
    """The settings the runner controls, under the names policies read."""
    out: dict[str, Any] = {"cluster_size": size, "topology": topology}
    if batch_size is not None:
        out["batch_size"] = batch_size
    if learning_rate is not None:
        out["learning_rate"] = learning_rate
    return out


def light_metrics(params: dict[str, Any], batch_size: int | None, elapsed: float | None) -> dict[str, Any]:
    """What costs no op to read: the parameters and the step's wall time."""
    metrics = dict(params)
    if elapsed is not None and elapsed > 0:
        metrics["step_time"] = elapsed
        if batch_size is not None:
            metrics["throughput"] = batch_size / elapsed
    return metrics


def step_metrics(
    access: VariableAccess, params: dict[str, Any], batch_size: int | None, size: int, elapsed: float | None
) -> dict[str, Any]:
    """Everything: the monitor's values, the parameters, the step's times and the link rates."""
    metrics = {k: python_value(v) for k, v in access.read_monitor().items()}
    metrics.update(params)
    if elapsed is not None and elapsed > 0:
        metrics["step_time"] = elapsed
        if batch_size is not None:
            metrics["throughput"] = batch_size / elapsed
    times = metrics.get("worker_compute_times")
    if batch_size is not None and isinstance(times, list):
        local = batch_size // size
        metrics["worker_throughput"] = [local / t if t > 0 else math.nan for t in times]
    with tf.init_scope():
        metrics["link_rates"] = [float(r) for r in monitor.comm_rates().numpy()]
    return metrics


def python_value(value: Any) -> Any:
    """A monitor value as a Python number or list (from numpy or tensors)."""
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "tolist"):
        value = value.tolist()
    return value
