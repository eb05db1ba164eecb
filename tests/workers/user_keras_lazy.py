"""Worker for tests/test_user_scripts.py: a Keras example as users write it.

A ``Sequential`` without ``Input`` (built by Keras at the first step),
SGD + momentum wrapped in SynchronousSGDOptimizer, ``model.fit`` on this
worker's shard with ``BroadcastGlobalVariablesCallback``. Every rank draws
different initial weights (initializer seeds include the rank), so only a
broadcast *before the first gradient* can make the run equal the reference:
rank 0 trains the same lazy model with rank 0's seeds and a plain optimizer
in this process, on the whole global batches, and the weights and optimizer
variables must match (rtol 1e-5, atol 1e-6); a consensus requires every
worker to hold rank 0's state. Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.keras import BroadcastGlobalVariablesCallback
from kungfu_tf.optimizers import SynchronousSGDOptimizer

RANK, SIZE = kungfu_tf.rank(), kungfu_tf.size()
STEPS, EPOCHS, B = 4, 2, 4  # batches per epoch, epochs, rows per worker and batch
FEATURES, HIDDEN, OUTPUTS = 5, 6, 2
LR, MOMENTUM = 0.1, 0.9


def lazy_model(seed_rank: int) -> keras.Model:
    """No Input: Keras builds it from the first batch. Seeds differ per rank."""
    def init(i: int) -> keras.initializers.Initializer:
        return keras.initializers.RandomNormal(stddev=0.5, seed=100 * seed_rank + i)

    return keras.Sequential([
        keras.layers.Dense(HIDDEN, activation="tanh", kernel_initializer=init(1), bias_initializer=init(2)),
        keras.layers.Dense(OUTPUTS, kernel_initializer=init(3), bias_initializer=init(4)),
    ])


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    n = STEPS * SIZE * B
    return rng.normal(size=(n, FEATURES)).astype(np.float32), rng.normal(size=(n, OUTPUTS)).astype(np.float32)


def shard(a: np.ndarray) -> np.ndarray:
    """B rows of every global batch of SIZE*B rows, disjoint across workers."""
    return a.reshape(STEPS, SIZE, B, *a.shape[1:])[:, RANK].reshape(STEPS * B, *a.shape[1:])


def state(model: keras.Model) -> list[np.ndarray]:
    return [v.numpy() for v in list(model.weights) + list(model.optimizer.variables)]


def main() -> None:
    chk = Checker(RANK)
    x, y = data()
    model = lazy_model(RANK)
    chk.true(not model.built, "the model is lazy (built at the first step)")
    model.compile(optimizer=SynchronousSGDOptimizer(keras.optimizers.SGD(LR, momentum=MOMENTUM)), loss="mse")
    callback = BroadcastGlobalVariablesCallback(root=0)
    model.fit(shard(x), shard(y), batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[callback])
    chk.true(callback.broadcast_done, "broadcast done")
    chk.true("train_step" not in vars(model), "the model has its own train_step back")
    got = state(model)
    flat = np.concatenate([g.astype(np.float64).reshape(-1) for g in got])
    chk.true(bool(ops.consensus(tf.constant(flat), name="agree").numpy()), "workers differ after training")
    if RANK == 0:
        reference = lazy_model(0)
        reference.compile(optimizer=keras.optimizers.SGD(LR, momentum=MOMENTUM), loss="mse")
        reference.fit(x, y, batch_size=SIZE * B, epochs=EPOCHS, shuffle=False, verbose=0)
        want = state(reference)
        chk.true(len(got) == len(want), f"{len(got)} state arrays, reference has {len(want)}")
        for i, (g, w) in enumerate(zip(got, want)):
            chk.true(np.allclose(g, w, rtol=1e-5, atol=1e-6), f"state {i}: max diff {np.max(np.abs(g - w))}")
    chk.done()


if __name__ == "__main__":
    main()
