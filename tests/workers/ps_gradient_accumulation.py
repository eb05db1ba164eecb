"""Worker for test_optimizer_step_state.py (``kungfu-run -np 2``): a worker that owns nothing, under PS.

``SynchronousSGDOptimizer(Nadam(gradient_accumulation_steps=2), strategy="PS")``:
rank 0 owns both variables, rank 1 updates none and only counts the step. It
counted with ``iterations.assign_add``, but with accumulated gradients Keras's
``iterations`` is a tensor (steps // 2): rank 1 died with an AttributeError in
its first step. Its Nadam ``u_product`` (step state, advanced on the steps that
update) must equal the owner's, for a later owner to take over with it.

Both ranks' weights, step counts and ``u_product`` equal one process's Nadam
on the mean of the two ranks' gradients. Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer

STEPS = 6
SHAPES = [(8, 3), (3,)]


def gradients(step: int, rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 * step + rank)
    return [rng.standard_normal(shape).astype(np.float32) for shape in SHAPES]


def make() -> keras.optimizers.Optimizer:
    return keras.optimizers.Nadam(0.05, gradient_accumulation_steps=2)


def start() -> list[keras.Variable]:
    return [keras.Variable(np.ones(shape, np.float32), name=f"v{i}") for i, shape in enumerate(SHAPES)]


def main() -> None:
    rank = env_rank()
    check = Checker(rank)
    variables = start()
    opt = SynchronousSGDOptimizer(make(), strategy="PS")

    @tf.function
    def step(grads: list[tf.Tensor]) -> None:
        opt.apply(grads, variables)

    reference_vars, reference = start(), make()
    for s in range(STEPS):
        step([tf.constant(g) for g in gradients(s, rank)])
        mean = [(a + b) / 2 for a, b in zip(gradients(s, 0), gradients(s, 1))]
        reference.apply(mean, reference_vars)
    for got, want in zip(variables, reference_vars):
        check.close(got.numpy(), want.numpy(), 1e-5, f"{got.name} after {STEPS} steps")
    check.equal(int(opt._iterations.numpy()), STEPS, "steps counted")
    check.close(opt._u_product.numpy(), reference._u_product.numpy(), 1e-7, "Nadam's u_product")
    check.done()


if __name__ == "__main__":
    main()
