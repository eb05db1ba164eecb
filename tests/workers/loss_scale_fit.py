"""Worker for test_sync_sgd.py (np=2): Keras ``fit`` under the mixed_float16 policy with one worker overflowing.

Rank 0's first batch holds a value beyond float16's range, rank 1's does not.

1. ``compile(optimizer=SynchronousSGDOptimizer(SGD))``: Keras wraps it in a
   ``LossScaleOptimizer``, which applies the step (and its all-reduce) only
   where the worker's own gradients are finite. Rank 0 skipped the average
   rank 1 entered: the averages paired with different steps, the scales
   drifted apart, and the job hung. Now every worker raises ValueError
   naming the cause and the form that works, before any collective; also
   with ``run_eagerly=True``, where the worker that overflows would not
   call ``apply`` at all (the refusal comes when the wrapper builds it).
2. ``compile(optimizer=SynchronousSGDOptimizer(LossScaleOptimizer(SGD)))``:
   the average comes first, so both workers skip the first step alike
   (halving the scale) and apply the second alike.

Ends with "checked N results" and a line "weights <sum> scale <scale>" that
the test compares across the workers.
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np

from kungfu_tf.optimizers import SynchronousSGDOptimizer


def model_and_data(rank: int, every_batch: bool = False):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1, dtype="float32")])
    x = np.ones((8, 4), np.float32) * (1 + rank)
    if rank == 0:
        x[0 if not every_batch else slice(None), 0] = 70000.0  # beyond float16's 65504: this worker's step overflows
    return model, x, np.ones((8, 1), np.float32)


def main() -> None:
    keras.mixed_precision.set_global_policy("mixed_float16")
    rank = env_rank()
    check = Checker(rank)

    model, x, y = model_and_data(rank)
    model.compile(optimizer=SynchronousSGDOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    try:
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        check.fail("fit with SynchronousSGDOptimizer inside compile()'s LossScaleOptimizer ran")
    except ValueError as e:
        check.true("SynchronousSGDOptimizer inside a LossScaleOptimizer" in str(e), f"the error names the cause: {e}")

    # Eagerly, Keras's cond runs only the branch taken: a worker whose every step overflows never calls apply.
    # The LossScaleOptimizer builds its inner optimizer on every worker first, and that is refused too.
    model, x, y = model_and_data(rank, every_batch=True)
    model.compile(optimizer=SynchronousSGDOptimizer(keras.optimizers.SGD(0.01)), loss="mse", run_eagerly=True)
    try:
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        check.fail("an eager fit with SynchronousSGDOptimizer inside compile()'s LossScaleOptimizer ran")
    except ValueError as e:
        check.true("SynchronousSGDOptimizer inside a LossScaleOptimizer" in str(e), f"the error names the cause: {e}")

    model, x, y = model_and_data(rank)
    before = [w.numpy().copy() for w in model.trainable_variables]
    opt = SynchronousSGDOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01)))
    model.compile(optimizer=opt, loss="mse")
    check.true(model.optimizer is opt, "compile() kept the optimizer (no LossScaleOptimizer of its own)")
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    check.true(float(opt.dynamic_scale) == opt.initial_scale / 2, f"the overflow halved the scale: {opt.dynamic_scale}")
    check.true(int(opt.iterations) == 1, f"one step applied, one skipped: {int(opt.iterations)}")
    changed = [not np.array_equal(a.numpy(), b) for a, b in zip(model.trainable_variables, before)]
    check.true(any(changed), "the second step trained")
    total = sum(float(np.sum(w.numpy(), dtype=np.float64)) for w in model.trainable_variables)
    print(f"weights {total!r} scale {float(opt.dynamic_scale)!r}", flush=True)
    print(f"checked {check.count} results", flush=True)


if __name__ == "__main__":
    main()
