"""Worker for test_wrapper_copy.py (``kungfu-run -np 2``): AdamW's exclusions from weight decay.

``AdamW(weight_decay=0.5)`` with ``exclude_from_weight_decay`` (by variable,
by name, and by a pattern that only a shard's name matches), wrapped by ``SynchronousSGDOptimizer`` (AllReduce and
PartitionedPS, whose 64x16 kernel is cut in one shard per rank). The
exclusions are not in the optimizer's config: the wrapper, rebuilt from it,
decayed every variable, and a shard is a variable of its own that an
exclusion by variable did not name. Both ranks' weights must equal one
process's AdamW, same exclusions, on the mean of the ranks' gradients.

Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders

SHAPES = {"kernel": (64, 16), "bias": (16,)}
STEPS = 3


def gradients(step: int, rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 * step + rank)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES.values()]


def start() -> list[keras.Variable]:
    return [keras.Variable(np.ones(shape, np.float32), name=name) for name, shape in SHAPES.items()]


def adamw(variables: list[keras.Variable], exclude: str) -> keras.optimizers.Optimizer:
    opt = keras.optimizers.AdamW(0.01, weight_decay=0.5)
    if exclude == "none":
        return opt
    if exclude == "kernel-by-variable":
        opt.exclude_from_weight_decay(var_list=[variables[0]])
    elif exclude == "only-shard-names":  # matches the shards' names alone: nothing excluded, as in one process
        opt.exclude_from_weight_decay(var_names=["shard"])
    else:
        opt.exclude_from_weight_decay(var_names=["bias"])
    return opt


def stepper(opt: keras.optimizers.Optimizer, variables: list[keras.Variable]):
    @tf.function
    def step(grads: list[tf.Tensor]) -> None:
        opt.apply(grads, variables)

    return step


CASES = [
    ("AllReduce", "kernel-by-variable"),
    ("AllReduce", "bias-by-name"),
    ("PartitionedPS", "kernel-by-variable"),
    ("PartitionedPS", "bias-by-name"),
    ("PartitionedPS", "only-shard-names"),
]


def main() -> None:
    rank = env_rank()
    check = Checker(rank)
    for n, (strategy, exclude) in enumerate(CASES):
        variables = start()
        source = builders.PartitionedPS(min_partition_bytes=64) if strategy == "PartitionedPS" else strategy
        opt = SynchronousSGDOptimizer(adamw(variables, exclude), strategy=source, name=f"case{n}")
        step = stepper(opt, variables)
        reference_vars = start()
        decayed_vars = start()
        reference, decayed = adamw(reference_vars, exclude), adamw(decayed_vars, "none")
        for s in range(STEPS):
            step([tf.constant(g) for g in gradients(s, rank)])
            mean = [(a + b) / 2 for a, b in zip(gradients(s, 0), gradients(s, 1))]
            reference.apply(mean, reference_vars)
            decayed.apply(mean, decayed_vars)
        for got, want, other in zip(variables, reference_vars, decayed_vars):
            check.close(got.numpy(), want.numpy(), 1e-6, f"{strategy}, {exclude}: {got.name}")
        # The exclusion matters: with every variable decayed the excluded one ends elsewhere (and with a pattern
        # that names no variable, nowhere).
        excluded = {"kernel-by-variable": 0, "bias-by-name": 1}.get(exclude)
        for i, (want, other) in enumerate(zip(reference_vars, decayed_vars)):
            differs = not np.allclose(want.numpy(), other.numpy(), atol=1e-4)
            check.true(differs == (i == excluded), f"{exclude}: variable {i} excluded in one process: {differs}")
    check.done()


if __name__ == "__main__":
    main()
