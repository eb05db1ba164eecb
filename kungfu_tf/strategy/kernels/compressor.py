"""Compressor kernel: gradients travel as float16 / bfloat16, optionally with error feedback.

``encode`` turns a worker's gradient into its *share* of the average,
``g / size``, in the wire dtype; the all-reduce then **sums** the shares
(``reduce_op`` is "sum") and ``decode`` casts the result back. Dividing
before the collective, in the gradient's own precision, is what keeps
float16 from overflowing: if every worker's gradient is within float16's
range (|g| <= 65504), every partial sum of shares is at most
``max |g|`` (a sum of at most ``size`` terms of at most ``max |g| / size``), so no
step of the all-reduce can leave the range, whatever the topology. Summing
in float32 instead would need a float32 wire, which is no compression at all;
summing the raw gradients (the old way) overflowed at 65504 / size per worker.

Non-finite results are an error, not a skipped step: ``decode`` raises
InvalidArgumentError naming the variable when the averaged gradient holds an
Inf or NaN (a gradient beyond float16's range, or a NaN/Inf gradient on any
worker). The all-reduce has run by then, so every worker sees the same
result and fails in the same step, instead of one worker waiting for the
others until its timeout. Skipping would hide a diverging model or a
gradient float16 cannot carry (bfloat16 has float32's range); the message
says so.

With error feedback the rounding error of each step is kept in a residual
variable and added to the next step's gradient (Seide et al. 2014;
Karimireddy et al. 2019), so the error does not accumulate over steps: after
T steps the sum of what a worker sent differs from the sum of its true
gradients by one step's rounding error, not T of them. (The all-reduce adds
the workers' messages in the wire dtype; the rounding of those additions is
not fed back.) The residual never stores a non-finite value: where the
encoding overflowed or the gradient was not finite, it is reset to zero, so
one bad step cannot poison every later one.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.strategy.kernels.compressor import Compressor
    >>> c = Compressor("bfloat16")
    >>> wire = c.encode(tf.constant([1.0, 1.00390625]))  # one worker: the share is the gradient
    >>> wire.dtype.name, c.reduce_op, c.decode(wire, tf.float32).numpy().tolist()
    ('bfloat16', 'sum', [1.0, 1.0])
"""

from __future__ import annotations

import tensorflow as tf

from kungfu_tf.ops import config


class Compressor:
    """Encodes a gradient as its share ``g / size`` in ``wire_dtype``; with ``residual``, error feedback.

    Args:
        wire_dtype: dtype on the wire ("float16"/"bfloat16"), or None for no
            compression: ``encode``/``decode`` return their input and
            ``reduce_op`` is "mean".
        residual: a variable shaped like the gradient holding the error
            carried over from the previous step (error feedback), or None.
        name: the variable (or shard) this gradient belongs to, for errors.

    Example:
        >>> r = tf.Variable(tf.zeros([1]))
        >>> c = Compressor("float16", residual=r, name="w")
        >>> _ = c.encode(tf.constant([1.0 + 2**-12]))   # not representable in fp16
        >>> float(r[0]) == 2**-12
        True
        >>> _ = c.encode(tf.constant([1e6]))   # beyond fp16: inf on the wire, the residual stays finite
        >>> float(r[0])
        0.0
    """

    def __init__(self, wire_dtype: str | None, residual: tf.Variable | None = None, name: str = "") -> None:
        self.wire_dtype = None if wire_dtype is None else tf.as_dtype(wire_dtype)
        self.residual = residual
        self.name = name

    @property
    def reduce_op(self) -> str:
        """The all-reduce that turns the encoded tensors into the average: "sum" of shares, or "mean"."""
        return "mean" if self.wire_dtype is None else "sum"

    def encode(self, g: tf.Tensor) -> tf.Tensor:
        """This worker's share of the average of ``g``, for the wire (updates the residual with error feedback)."""
        if self.wire_dtype is None:
            return g
        # Divide in at least float32: a float16 gradient divided in float16
        # would round (and underflow) twice.
        work = tf.float32 if g.dtype.size < 4 else g.dtype
        size = tf.cast(config.cluster_size(), work)
        corrected = tf.cast(g, work) + (0 if self.residual is None else tf.cast(self.residual, work))
        wire = tf.cast(corrected / size, self.wire_dtype)
        if self.residual is None:
            return wire
        sent = tf.cast(wire, work) * size
        error = corrected - sent
        # Inf - Inf or an Inf/NaN gradient would make every later step
        # non-finite; that step fails in decode, the residual restarts at 0.
        error = tf.where(tf.math.is_finite(error), error, tf.zeros_like(error))
        with tf.control_dependencies([self.residual.assign(tf.cast(error, self.residual.dtype))]):
            return tf.identity(wire)

    def decode(self, wire: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """The all-reduced (summed) shares back in the variable's ``dtype``.

        Raises InvalidArgumentError (when the step runs) naming the variable
        if the average is not finite.
        """
        if self.wire_dtype is None:
            return wire if wire.dtype == dtype else tf.cast(wire, dtype)
        out = wire if wire.dtype == dtype else tf.cast(wire, dtype)
        limit = float(self.wire_dtype.max)
        return tf.debugging.check_numerics(
            out,
            f"kungfu compressor: the averaged gradient of {self.name or 'a variable'!r} is not finite after a "
            f"{self.wire_dtype.name} all-reduce (a worker's gradient was Inf/NaN, or beyond {limit:g}, the largest "
            f"{self.wire_dtype.name}; bf16 compression has float32's range)",
        )
