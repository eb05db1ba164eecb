"""Many steps of a tf.function with a GradientMonitor, one TF thread: is compute_time the step's compute?

    python step_clock_steps.py STEPS

Prints ``short N of STEPS: [step, compute_time, wall]...``: the steps whose compute_time was under 100 us,
impossible for this model's forward and backward pass (~100 MFLOP), i.e. the clock started after the
gradients were ready instead of when the step started.
"""

from __future__ import annotations

import os
import sys
import time

os.environ["TF_NUM_INTRAOP_THREADS"] = "1"
os.environ["TF_NUM_INTEROP_THREADS"] = "1"

import keras
import numpy as np
import tensorflow as tf

from kungfu_tf.optimizers import GradientMonitor, SynchronousSGDOptimizer

BATCH, FEATURES, HIDDEN = 256, 256, 512


def main(steps: int) -> None:
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Dense(10)])  # fmt: skip
    monitor = GradientMonitor(batch_size=BATCH, gns=False)
    optimizer = SynchronousSGDOptimizer(keras.optimizers.SGD(0.01), monitor=monitor)
    optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x = np.random.default_rng(0).random((BATCH, FEATURES), np.float32)
    y = np.zeros(BATCH, np.int32)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_object(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    short = []
    for step in range(steps):
        start = time.perf_counter()
        train_step(x, y)
        wall = time.perf_counter() - start
        compute = monitor.values()["compute_time"]
        if compute < 1e-4:
            short.append((step, compute, wall))
    print(f"short {len(short)} of {steps}: {short[:10]}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
