"""Worker for test_wrapper_copy.py (``kungfu-run -np 2``): a learning-rate schedule of the user's own.

A warm-up schedule class the script defines, not registered with Keras's
serialisation (as users write one for BERT), in ``SynchronousSGDOptimizer(
SGD(Warmup(...), momentum=0.9))`` and in the same under ``PSLoadBalancing``:
making the wrapper raised ``TypeError: Could not locate class 'Warmup'``
(the wrapper is rebuilt from the optimizer's config). Both ranks' weights
after ``fit`` must equal one process's ``fit`` with the same schedule on the
union batches. Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np

from kungfu_tf.optimizers import SynchronousSGDOptimizer

BATCH, STEPS = 8, 6


class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up to ``peak`` over ``steps`` steps, then flat."""

    def __init__(self, peak: float, steps: int) -> None:
        self.peak, self.steps = peak, steps

    def __call__(self, step):
        return self.peak * keras.ops.minimum(1.0, (keras.ops.cast(step, "float32") + 1.0) / self.steps)

    def get_config(self) -> dict:
        return {"peak": self.peak, "steps": self.steps}


def data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10 + rank)
    return rng.standard_normal((BATCH * STEPS, 32)).astype(np.float32), rng.integers(0, 4, BATCH * STEPS)


def model() -> keras.Model:
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((32,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)])


def main() -> None:
    rank = env_rank()
    check = Checker(rank)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    (x0, y0), (x1, y1) = data(0), data(1)
    batches = [slice(s * BATCH, (s + 1) * BATCH) for s in range(STEPS)]
    xu = np.concatenate([np.concatenate([x0[b], x1[b]]) for b in batches])
    yu = np.concatenate([np.concatenate([y0[b], y1[b]]) for b in batches])
    reference = model()
    reference.compile(optimizer=keras.optimizers.SGD(Warmup(0.5, 4), momentum=0.9), loss=loss)
    reference.fit(xu, yu, batch_size=2 * BATCH, epochs=1, shuffle=False, verbose=0)
    for strategy in (None, "PSLoadBalancing"):
        net = model()
        opt = SynchronousSGDOptimizer(keras.optimizers.SGD(Warmup(0.5, 4), momentum=0.9), strategy=strategy,
                                      name=f"warmup-{strategy}")  # fmt: skip
        net.compile(optimizer=opt, loss=loss)
        x, y = data(rank)
        net.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
        for got, want in zip(net.trainable_weights, reference.trainable_weights):
            check.close(got.numpy(), want.numpy(), 1e-5, f"{strategy}: {got.path} after fit")
        check.close(float(opt.learning_rate), 0.5, 1e-7, f"{strategy}: the schedule's rate after {STEPS} steps")
    check.done()


if __name__ == "__main__":
    main()
