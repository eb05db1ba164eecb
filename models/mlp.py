"""A small multi-layer perceptron for the synthetic teacher data.

Example:
    >>> model = build_mlp(features=16, classes=4, hidden=(32,))
    >>> model.output_shape
    (None, 4)
"""

from __future__ import annotations

from collections.abc import Sequence

import keras


def build_mlp(features: int, classes: int, hidden: Sequence[int] = (128, 128), seed: int | None = None) -> keras.Model:
    """Dense ReLU layers then a linear layer producing class logits."""
    init = keras.initializers.GlorotUniform(seed=seed)
    inputs = keras.Input(shape=(features,))
    h = inputs
    for width in hidden:
        h = keras.layers.Dense(width, activation="relu", kernel_initializer=init)(h)
    outputs = keras.layers.Dense(classes, kernel_initializer=init)(h)
    return keras.Model(inputs, outputs)
