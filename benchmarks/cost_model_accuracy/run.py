"""The cost model alone against the strategy benchmark's measured per-iteration times.

Reads the two "Per-iteration time, np=4" tables of
docs/guide/synchronisation-strategies.md (medians measured by
``make bench-strategies``: seven builders on the repository's models, one host
and two hosts joined by a 1 Gbit/s link), predicts each builder's step with
:class:`~kungfu_tf.strategy.auto.cost_model.CostModel` on uniform link rates,
and prints, per setting and cost-model variant, the share of builder pairs it
orders as measured (pairs within ``--tie`` of each other are left out) and how
often it names the fastest builder. No worker runs: the measurements are the
published ones, so the numbers are the same on any machine.

Example:
    >>> from benchmarks.cost_model_accuracy.run import parse_time
    >>> parse_time("**1.65 s**"), parse_time("527 ms")
    (1.65, 0.527)
"""

from __future__ import annotations

import argparse
import re
import sys

import numpy as np

from benchmarks.harness.paths import REPO

GUIDE = REPO / "docs" / "guide" / "synchronisation-strategies.md"
BUILDERS = ("AllReduce", "PS", "PSLoadBalancing", "PartitionedPS", "UnevenPartitionedPS", "PartitionedAR", "Parallax")
SETTINGS = {"one host": ("one host (loopback)", 1), "two hosts": ("two hosts, 2 workers each", 2)}


def parse_time(cell: str) -> float:
    """Seconds in a table cell such as "527 ms" or "**1.65 s**"."""
    m = re.fullmatch(r"\**\s*([\d.]+)\s*(ms|s)\s*\**", cell.strip())
    if not m:
        raise ValueError(f"not a time: {cell!r}")
    return float(m.group(1)) * (1e-3 if m.group(2) == "ms" else 1.0)


def measured_tables(text: str) -> dict[str, dict[str, list[float]]]:
    """setting -> model -> the builders' seconds, in BUILDERS order, from the guide's tables."""
    out: dict[str, dict[str, list[float]]] = {}
    for setting, (heading, _) in SETTINGS.items():
        section = text.split(f"### Per-iteration time, np=4, {heading}", 1)[1].split("###", 1)[0]
        rows = {}
        for line in section.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 10 and cells[0] not in ("model", "") and not cells[0].startswith("-"):
                rows[cells[0]] = [parse_time(c) for c in cells[2:9]]  # skip "no strategy" and "best"
        out[setting] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tie", type=float, default=0.03, help="relative difference below which two builders tie")
    p.add_argument("--bandwidth", type=float, default=3e9, help="bytes/s between ranks of one host")
    p.add_argument("--latency", type=float, default=3e-4, help="seconds per message")
    p.add_argument("--cross-host", type=float, default=1.25e8, help="bytes/s between hosts (1 Gbit/s)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(REPO / "models"))
    import keras
    import registry

    from kungfu_tf.strategy.auto.cost_model import CostModel
    from kungfu_tf.strategy.auto.link_rates import LinkRates
    from kungfu_tf.strategy.auto.ranker import pairwise_accuracy
    from kungfu_tf.strategy.builders import build
    from kungfu_tf.strategy.cluster_spec import ClusterSpec
    from kungfu_tf.strategy.variable_info import describe_model

    tables = measured_tables(GUIDE.read_text())
    variables = {}
    for name in sorted({m for rows in tables.values() for m in rows}):
        keras.backend.clear_session()
        variables[name] = describe_model(registry.MODELS[name].build())
    variants = {
        "transfers only": {"apply_passes": 0.0},
        "defaults": {},
        "defaults, cores_per_host=2": {"cores_per_host": 2},
    }
    print("| cost model | setting | pairs ordered as measured | fastest builder named | per model |")
    print("|---|---|---:|---:|---|")
    for label, options in variants.items():
        model = CostModel(**options)
        for setting, rows in tables.items():
            cluster = ClusterSpec.uniform(4, SETTINGS[setting][1])
            cross = args.cross_host if cluster.num_hosts > 1 else None
            rates = LinkRates.uniform(4, args.bandwidth, args.latency, cluster.hosts, cross_host_bandwidth=cross)
            accuracy, named = [], 0
            for name, times in rows.items():
                vs = variables[name]
                predicted = [model.predict(build(b, vs, cluster), vs, cluster, rates).total for b in BUILDERS]
                accuracy.append(pairwise_accuracy(predicted, times, args.tie))
                named += int(np.argmin(predicted) == np.argmin(times))
            per_model = ", ".join(f"{n} {a:.2f}" for n, a in zip(rows, accuracy, strict=True))
            print(f"| {label} | {setting} | {np.mean(accuracy):.0%} | {named}/{len(rows)} | {per_model} |")
    return 0
