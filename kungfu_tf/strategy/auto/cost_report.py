"""The cost model's breakdown as a table a person can read (``kungfu-strategy explain --costs``).

One row per variable with its share of each component, a total row, the
busiest resource, and the link rates the prediction used, so that a reader
sees which variables cost the step its time and why.

Example:
    >>> from kungfu_tf.strategy.builders import build
    >>> from kungfu_tf.strategy.cluster_spec import ClusterSpec
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> from kungfu_tf.strategy.auto.cost_model import CostModel
    >>> from kungfu_tf.strategy.auto.cost_report import format_costs
    >>> from kungfu_tf.strategy.auto.link_rates import LinkRates
    >>> vs, cluster = [VariableInfo("w", (1000, 250)), VariableInfo("b", (250,))], ClusterSpec(2)
    >>> rates = LinkRates.uniform(2, 1e9, 1e-4)
    >>> print(format_costs(CostModel().predict(build("PS", vs, cluster), vs, cluster, rates), rates))
    cost model (ms per iteration): np=2 hosts=0,0; within a host 1.00 GB/s, 100 us (uniform rates)
    <BLANKLINE>
    variable  AR bytes  AR latency  PS bytes  PS latency  sparse rows  local  total
    w            0.000       0.000     1.000       0.200        0.000  1.020  2.220
    b            0.000       0.000     0.001       0.200        0.000  0.021  0.222
    total        0.000       0.000     1.001       0.400        0.000  1.041  2.442
    <BLANKLINE>
    predicted sync time 2.442 ms per iteration; busiest resource: link 0->1
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kungfu_tf.strategy.auto.cost_model import CostBreakdown
from kungfu_tf.strategy.auto.link_rates import LinkRates

_HEADERS = ("variable", "AR bytes", "AR latency", "PS bytes", "PS latency", "sparse rows", "local", "total")


def _rate(bytes_per_s: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.2f} {unit}"
    return f"{bytes_per_s:.0f} B/s"


def _micros(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us"


def _span(values: np.ndarray, text: Callable[[float], str]) -> str:
    low, high = float(values.min()), float(values.max())
    return text(low) if np.isclose(low, high) else f"{text(low)} .. {text(high)}"


def describe_rates(rates: LinkRates) -> str:
    """One line: bandwidth and latency within hosts and between them (ranges when they vary).

    Example:
        >>> describe_rates(LinkRates.uniform(2, 2e9, 5e-5, hosts=(0, 1), cross_host_bandwidth=1.25e8))
        'np=2 hosts=0,1; between hosts 125.00 MB/s, 50 us (uniform rates)'
    """
    n = rates.replicas
    hosts = np.array(rates.hosts)
    off = ~np.eye(n, dtype=bool)
    same = np.equal.outer(hosts, hosts) & off
    cross = ~np.equal.outer(hosts, hosts)
    bw, lat = np.array(rates.bandwidth), np.array(rates.latency)
    parts = []
    for mask, where in ((same, "within a host"), (cross, "between hosts")):
        if mask.any():
            parts.append(f"{where} {_span(bw[mask], _rate)}, {_span(lat[mask], _micros)}")
    described = "; ".join(parts) or "no links"
    return f"{rates.signature}; {described} ({rates.origin} rates)"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(_HEADERS)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest]).rstrip()

    return [line(_HEADERS)] + [line(r) for r in rows]


def format_costs(costs: CostBreakdown, rates: LinkRates) -> str:
    """The per-variable breakdown of ``costs`` (milliseconds per iteration) and the rates behind it."""

    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.3f}"

    rows = [[v.var_name, *(ms(c) for c in v.components), ms(v.total)] for v in costs.variables]
    rows.append(["total", *(ms(c) for c in costs.components), ms(costs.sync_time)])
    summary = f"predicted sync time {ms(costs.sync_time)} ms per iteration"
    if costs.compute_time:
        summary += f", step {ms(costs.step_time)} ms with {ms(costs.compute_time)} ms of compute"
    if costs.bottleneck:
        summary += f"; busiest resource: {costs.bottleneck}"
    return "\n".join(
        [f"cost model (ms per iteration): {describe_rates(rates)}", "", *_table(rows), "", summary]
    )
