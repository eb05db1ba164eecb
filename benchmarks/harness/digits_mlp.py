"""The MLP 64-hidden-hidden-10 that the digits experiments train (adaptive batch size, Listing 1)."""

from __future__ import annotations


def build_model(hidden: int, seed: int):
    """Two ReLU layers of ``hidden`` units and 10 logits, Glorot-initialised from ``seed``."""
    import keras

    init = keras.initializers.GlorotUniform(seed=seed)
    return keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
            keras.layers.Dense(hidden, activation="relu", kernel_initializer=init),
            keras.layers.Dense(10, kernel_initializer=init),
        ]
    )
