"""Worker for tests/test_user_scripts.py: ``LearningRateWarmupCallback`` as Horovod's users call it.

The script compiles SGD + momentum (wrapped in SynchronousSGDOptimizer) with
the already scaled rate ``SCALED`` and passes the same rate to the callback.
Checked against numpy implementations of Horovod's definition:

* the rate before every batch: ``SCALED/size·(1 + (size-1)·(e + (b+1)/spe)/warmup)``
  during the ``warmup`` epochs, unchanged afterwards; ``logs["lr"]`` (History)
  at every epoch end;
* the trained weights: momentum SGD on the average gradient (numpy, float64),
  where Horovod's momentum correction multiplies the momentum coefficient of
  each warm-up batch by ``new_lr / old_lr``.

Two runs: steps per epoch found from ``fit`` with momentum correction, and
``steps_per_epoch`` given with ``momentum_correction=False``.
Ends with "checked N results" (N = 2 * (1 + EPOCHS * SPE + 1 + 2) = 26).
"""

from __future__ import annotations

import keras
from _setup import Checker, np

import kungfu_tf
from kungfu_tf.keras import LearningRateWarmupCallback
from kungfu_tf.optimizers import SynchronousSGDOptimizer

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()
SPE, EPOCHS, WARMUP, B = 3, 3, 2, 4  # steps per epoch, epochs, warm-up epochs, rows per worker and batch
FEATURES, OUTPUTS = 3, 2
SCALED, MOMENTUM = 0.05 * SIZE, 0.9


class LrRecorder(keras.callbacks.Callback):
    """The rate each batch runs with (placed after the warm-up callback)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[float] = []

    def on_train_batch_begin(self, batch, logs=None) -> None:
        self.seen.append(float(self.model.optimizer.learning_rate.numpy()))


def horovod_lr(epoch: int, batch: int) -> float | None:
    """Horovod's warm-up rate before (epoch, batch); None after the warm-up (left alone)."""
    if epoch >= WARMUP:
        return None
    return SCALED / SIZE * (1 + (SIZE - 1) * (epoch + (batch + 1) / SPE) / WARMUP)


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(21)
    n = SPE * SIZE * B
    return rng.normal(size=(n, FEATURES)), rng.normal(size=(n, OUTPUTS))


def initial() -> list[np.ndarray]:
    rng = np.random.default_rng(22)
    return [rng.normal(size=(FEATURES, OUTPUTS)), rng.normal(size=(OUTPUTS,))]


def numpy_training(correction: bool) -> tuple[list[float], list[np.ndarray]]:
    """Rates and final weights of Horovod's warm-up on synchronous momentum SGD, in float64."""
    x, y = data()
    w, b = initial()
    vw, vb = np.zeros_like(w), np.zeros_like(b)
    lr, rates = SCALED, []
    for epoch in range(EPOCHS):
        for batch in range(SPE):
            new = horovod_lr(epoch, batch)
            momentum = MOMENTUM
            if new is not None:
                if correction:
                    momentum = MOMENTUM * new / lr
                lr = new
            rates.append(lr)
            rows = slice(batch * SIZE * B, (batch + 1) * SIZE * B)  # the global batch
            err = x[rows] @ w + b - y[rows]
            gw, gb = 2 * x[rows].T @ err / err.size, 2 * err.sum(axis=0) / err.size
            vw, vb = momentum * vw - lr * gw, momentum * vb - lr * gb
            w, b = w + vw, b + vb
    return rates, [w, b]


def shard(a: np.ndarray) -> np.ndarray:
    return a.reshape(SPE, SIZE, B, *a.shape[1:])[:, RANK].reshape(SPE * B, *a.shape[1:])


def run(chk: Checker, correction: bool, steps_per_epoch: int | None) -> None:
    what = f"correction={correction}, steps_per_epoch={steps_per_epoch}"
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)])
    model.set_weights([a.astype(np.float32) for a in initial()])
    model.compile(optimizer=SynchronousSGDOptimizer(keras.optimizers.SGD(SCALED, momentum=MOMENTUM)), loss="mse")
    warmup = LearningRateWarmupCallback(SCALED, warmup_epochs=WARMUP, momentum_correction=correction,
                                        steps_per_epoch=steps_per_epoch)
    recorder = LrRecorder()
    x, y = data()
    history = model.fit(shard(x).astype(np.float32), shard(y).astype(np.float32), batch_size=B, epochs=EPOCHS,
                        shuffle=False, verbose=0, callbacks=[warmup, recorder])
    rates, weights = numpy_training(correction)
    chk.true(len(recorder.seen) == len(rates), f"{what}: {len(recorder.seen)} batches")
    for i, (got, want) in enumerate(zip(recorder.seen, rates)):
        chk.close(got, want, 1e-7 * SCALED, f"{what}: rate before batch {i}")
    chk.close(history.history["lr"], [rates[(e + 1) * SPE - 1] for e in range(EPOCHS)], 1e-7 * SCALED,
              f"{what}: logs['lr'] per epoch")
    for i, (got, want) in enumerate(zip(model.get_weights(), weights)):
        chk.close(got, want, 1e-5, f"{what}: weight {i} vs numpy")


def main() -> None:
    chk = Checker(RANK)
    run(chk, correction=True, steps_per_epoch=None)
    run(chk, correction=False, steps_per_epoch=SPE)
    chk.done()


if __name__ == "__main__":
    main()
