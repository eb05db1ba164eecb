"""Worker for tests/test_gradient_monitor_switch.py: the GNS monitor across strategy switches.

Usage: gradient_monitor_switch.py

The linear regression of tests/workers/gradient_monitor.py (learning rate 0:
every step samples the same gradient distribution, and each worker can
rebuild every worker's gradient in numpy), with SGD momentum (a slot built
lazily at the first step) and ``SynchronousSGDOptimizer(strategy=AllReduce,
monitor=GradientMonitor(...))`` in a ``kungfu_tf.elastic.function`` loop. After
step 4 every worker switches to PartitionedAR (the weight cut in ``size``
shards, one all-reduce each), after step 8 back to AllReduce. Checked on every rank, at every step: the
monitor's values (GNS, its raw estimate, the smoothed noise trace and
squared gradient norm, the gradient variance every 3 steps) equal the numpy
replay of the estimator on every worker's data — the smoothed state
continues across the switches, and the re-traced steps feed the monitor the
whole averaged gradient, not one shard. A switch to a parameter-server
strategy is refused (the monitor needs every averaged gradient on every
worker) with the monitor's values and the plan unchanged, and training goes on.

Ends with "checked N results"; N is expected_checks() in the test.
"""

from __future__ import annotations

import _setup
import keras
from _setup import Checker, np, tf
from gradient_monitor import SMOOTHING, VARIANCE_INTERVAL, W0, B, Replay, batch, compare

import kungfu_tf
from kungfu_tf.optimizers import (
    GradientMonitor,
    SynchronousSGDOptimizer,
    switch_strategy,
)
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.errors import StrategyError

STEPS = 12
REPLAYED = ("gns", "gns_raw", "noise_trace", "grad_sq_norm", "grad_variance")


def switches(size: int) -> dict[int, builders.StrategyBuilder]:
    """Step -> the strategy every worker switches to before it (the 16-byte weight cut in ``size`` shards)."""
    return {4: builders.PartitionedAR(min_partition_bytes=8), 8: builders.AllReduce()}


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    monitor = GradientMonitor(batch_size=B, smoothing=SMOOTHING, variance_interval=VARIANCE_INTERVAL)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.0, momentum=0.9), strategy=builders.AllReduce(),
                                  monitor=monitor, name="gns_switch")  # fmt: skip
    w = keras.Variable(W0.astype(np.float32), name="w_switch")

    @kungfu_tf.elastic.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_mean(tf.square(tf.linalg.matvec(x, w.value) - y))
        opt.apply_gradients([(tape.gradient(loss, w.value), w)])

    replay = Replay(size)
    plan = None
    for t in range(STEPS):
        target = switches(size).get(t)
        if target is not None:
            report = switch_strategy(opt, target)
            chk.true(report.changed and report.slot_kinds == 1, f"switch before step {t}: {report}")
            plan = opt._kungfu_plan
            if t == 4:
                cut = [n for n in plan.strategy.node_config if n.part_config]
                chk.true(len(cut) == 1, f"PartitionedAR cut {len(cut)} variables, expected the weight")
        train_step(*batch(t, rank))
        want = replay.step(t)
        compare(chk, monitor.values(), want, f"step {t} ({opt._kungfu_plan.strategy.id})", REPLAYED)
        if t == 9:
            before = monitor.values()
            try:
                switch_strategy(opt, builders.PS())
                chk.fail("switch to PS", "no error")
            except StrategyError as e:
                chk.true("GradientMonitor" in str(e), f"switch to PS: {e}")
            after = monitor.values()
            chk.true(opt._kungfu_plan is plan, "switch to PS: the plan changed")
            chk.true(all(np.array_equal(before[k], after[k], equal_nan=True) for k in REPLAYED),
                     "switch to PS: the monitor's values changed")  # fmt: skip
    chk.true(train_step.traces == 3, f"the step was traced {train_step.traces} times, expected 3 (once per strategy)")
    print(f"np={size}: GNS {monitor.values()['gns']:.3f} after {STEPS} steps and 2 switches", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
