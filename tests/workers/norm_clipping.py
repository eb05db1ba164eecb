"""Worker for test_norm_clipping.py (``kungfu-run -np 2``): Keras's clipping by norm under parameter servers.

Each case trains two variables (a 64x16 kernel, a 16 bias) for three steps
with ``SynchronousSGDOptimizer(SGD(0.1, <clipping>), strategy=...)`` on
per-rank gradients, and compares both ranks' weights with one process's SGD
of the same clipping on the mean of the two ranks' gradients (the union
batch). Before, with parameter servers each owner clipped by the norm of
what it owned (the global norm of its own variables; one shard's norm for a
partitioned variable): the bias left one process's by 0.05, the kernel by
3e-3. The gradients are large enough that every step clips.

* global_clipnorm, PSLoadBalancing (rank 0 owns the kernel, rank 1 the bias),
  in a ``tf.function`` and eagerly;
* clipnorm, PartitionedPS (the kernel cut in two shards, one per rank);
* global_clipnorm, AllReduce (Keras clips as in one process: the control);
* global_clipnorm, the kernel all-reduced and the bias on rank 0 (a mixed plan);
* global_clipnorm with a stale parameter server (staleness 1): refused on every
  rank with the same StrategyError before anything is sent.

Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.builders import build
from kungfu_tf.strategy.cluster_spec import ClusterSpec
from kungfu_tf.strategy.errors import StrategyError
from kungfu_tf.strategy.variable_info import describe_variables

SHAPES = [(64, 16), (16,)]
STEPS = 3


def gradients(step: int, rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 * step + rank)
    return [3 * rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def start() -> list[keras.Variable]:
    return [keras.Variable(np.ones(shape, np.float32), name=f"v{i}") for i, shape in enumerate(SHAPES)]


CASES = [
    ("global-ps-function", {"global_clipnorm": 0.5}, lambda: "PSLoadBalancing", True),
    ("global-ps-eager", {"global_clipnorm": 0.5}, lambda: "PSLoadBalancing", False),
    ("norm-partitioned", {"clipnorm": 0.5}, lambda: builders.PartitionedPS(min_partition_bytes=64), True),
    ("global-all-reduce", {"global_clipnorm": 0.5}, lambda: "AllReduce", True),
    ("global-mixed", {"global_clipnorm": 0.5}, lambda: mixed(), True),
]


def mixed():
    """The kernel all-reduced, the bias on rank 0: every rank holds the kernel's average (its norm counted
    once, by rank 0), only rank 0 the bias's."""
    variables = describe_variables(start())
    strategy = build("AllReduce", variables, ClusterSpec(2))
    strategy.node_config[1].CopyFrom(build("PS", variables, ClusterSpec(2)).node_config[1])
    return strategy


def stepper(opt: keras.optimizers.Optimizer, variables: list[keras.Variable], traced: bool):
    def step(grads: list[tf.Tensor]) -> None:
        opt.apply(grads, variables)

    return tf.function(step) if traced else step


def main() -> None:
    rank = env_rank()
    check = Checker(rank)
    for name, clipping, strategy, traced in CASES:
        variables = start()
        opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, **clipping), strategy=strategy(), name=name)

        run = stepper(opt, variables, traced)
        reference_vars, reference = start(), keras.optimizers.SGD(0.1, **clipping)
        for s in range(STEPS):
            run([tf.constant(g) for g in gradients(s, rank)])
            reference.apply([(a + b) / 2 for a, b in zip(gradients(s, 0), gradients(s, 1))], reference_vars)
        for got, want in zip(variables, reference_vars):
            check.close(got.numpy(), want.numpy(), 1e-6, f"{name}: {got.name} after {STEPS} steps")
        check.true(opt.clipnorm == clipping.get("clipnorm") and opt.global_clipnorm == clipping.get("global_clipnorm"),
                   f"{name}: the optimizer's clipping is as it was made")  # fmt: skip

    variables = start()
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, global_clipnorm=0.5),
                                  strategy=builders.PS(staleness=1), name="stale")  # fmt: skip
    try:
        stepper(opt, variables, True)([tf.constant(g) for g in gradients(0, rank)])
        check.true(False, "a stale parameter server with global_clipnorm is refused")
    except StrategyError as e:
        check.true("clipping gradients by norm (global 0.5) needs the norm of one step's" in str(e), str(e))
    check.done()


if __name__ == "__main__":
    main()
