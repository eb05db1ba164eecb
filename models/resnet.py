"""CIFAR-style ResNet (He et al. 2016, section 4.2): ResNet-20, ResNet-56, ...

depth = 6n + 2: a 3x3 stem convolution, three stages of n basic blocks (two
3x3 convolutions each) with width, 2*width and 4*width filters, then global
average pooling and a dense layer. Each stage after the first halves the
spatial size. Shortcuts that change shape use a 1x1 convolution projection
(option B), which is simpler in Keras than zero-padding and changes little.

Example:
    >>> model = build_resnet(depth=8, width=4, input_shape=(16, 16, 3))
    >>> model.output_shape
    (None, 10)
"""

from __future__ import annotations

import keras


def _conv_bn(x: keras.KerasTensor, filters: int, kernel: int, stride: int, relu: bool) -> keras.KerasTensor:
    # No bias: the following BatchNorm's beta makes it redundant.
    x = keras.layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False, kernel_initializer="he_normal")(x)
    x = keras.layers.BatchNormalization()(x)
    return keras.layers.ReLU()(x) if relu else x


def _basic_block(x: keras.KerasTensor, filters: int, stride: int) -> keras.KerasTensor:
    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, stride, relu=False)
    h = _conv_bn(x, filters, 3, stride, relu=True)
    h = _conv_bn(h, filters, 3, 1, relu=False)
    return keras.layers.ReLU()(keras.layers.Add()([h, shortcut]))


def build_resnet(
    depth: int = 20,
    num_classes: int = 10,
    width: int = 16,
    input_shape: tuple[int, int, int] = (32, 32, 3),
) -> keras.Model:
    """An uncompiled CIFAR ResNet producing class logits.

    ``depth`` must be 6n + 2 (8, 14, 20, 32, 44, 56, 110, ...); use a small
    depth/width/input_shape for tests.

    Example:
        >>> build_resnet(depth=20).count_params() > 270_000
        True
        >>> build_resnet(depth=21)
        Traceback (most recent call last):
        ...
        ValueError: ResNet depth must be 6n+2 (e.g. 20, 56), got 21
    """
    if depth < 8 or (depth - 2) % 6 != 0:
        raise ValueError(f"ResNet depth must be 6n+2 (e.g. 20, 56), got {depth}")
    blocks_per_stage = (depth - 2) // 6
    inputs = keras.Input(shape=input_shape)
    x = _conv_bn(inputs, width, 3, 1, relu=True)
    for stage in range(3):
        filters = width * 2**stage
        for block in range(blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _basic_block(x, filters, stride)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name=f"resnet{depth}")
