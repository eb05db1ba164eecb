"""Common start of every worker script: TensorFlow threading and numpy helpers.

Import this first (``import _setup``): it configures TensorFlow for a 2-core
machine shared by several workers before any op runs.

Inputs are deterministic functions of (case, rank), so every worker can
rebuild every other worker's input and compute the expected result with
numpy, independently of the runtime.
"""

from __future__ import annotations

import contextlib
import os
import sys
import zlib

import numpy as np
import tensorflow as tf

# Raises RuntimeError once TF has started: a test may import a worker module
# in-process (tests/test_gradient_monitor.py, np=1) after setting them itself.
with contextlib.suppress(RuntimeError):
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(2)

from kungfu_tf import ops

__all__ = ["np", "ops", "tf"]

DTYPES = {
    "float16": tf.float16,
    "bfloat16": tf.bfloat16,
    "float32": tf.float32,
    "float64": tf.float64,
    "int32": tf.int32,
    "int64": tf.int64,
    "uint8": tf.uint8,
}
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
TOPOLOGIES = ("STAR", "RING", "BINARY_TREE", "BINARY_TREE_STAR", "CLIQUE", "AUTO")


def session_config() -> tf.compat.v1.ConfigProto:
    """ConfigProto with the same thread limits, for tf.compat.v1.Session."""
    return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)


def np_dtype(name: str):
    """numpy dtype of a dtype name (bfloat16 comes from ml_dtypes via TF)."""
    return DTYPES[name].as_numpy_dtype


def env_rank() -> int:
    """This worker's rank as set by the launcher (0 without it)."""
    return int(os.environ.get("KUNGFU_RANK", "0"))


def env_size() -> int:
    """Cluster size as set by the launcher (1 without it)."""
    return int(os.environ.get("KUNGFU_SIZE", "1"))


def seed_of(*parts: object) -> int:
    """A stable seed from arbitrary parts (Python's hash() is salted)."""
    return zlib.crc32(repr(parts).encode())


def make_input(case: str, rank: int, shape: tuple[int, ...], dtype: str, kind: str) -> np.ndarray:
    """Rank ``rank``'s input for ``case``: deterministic, a numpy array of ``dtype``.

    kind:
      "real"  random reals in [-1, 1) (floats) / wide-range integers (ints);
      "small" small integers (exact products in every dtype, incl. bfloat16);
      "big"   integers that need the full width of the dtype (min/max).
    """
    rng = np.random.default_rng(seed_of(case, rank))
    n = int(np.prod(shape, dtype=np.int64))
    if dtype in FLOAT_DTYPES:
        if kind == "real":
            v = rng.uniform(-1.0, 1.0, n)
        elif kind == "small":
            v = rng.integers(-3, 4, n).astype(np.float64)
        else:
            v = rng.integers(-200, 201, n).astype(np.float64)
    else:
        lo, hi = {
            ("uint8", "real"): (0, 256),  # sums wrap around, as in TF
            ("uint8", "small"): (0, 4),
            ("uint8", "big"): (0, 256),
            ("int32", "real"): (-(10**6), 10**6),
            ("int32", "small"): (-40, 41),
            ("int32", "big"): (-(2**31), 2**31),
            ("int64", "real"): (-(10**15), 10**15),
            ("int64", "small"): (-30000, 30001),
            ("int64", "big"): (-(2**63), 2**63),
        }[(dtype, kind)]
        v = rng.integers(lo, hi, n, dtype=np.int64)
    return np.asarray(v.reshape(shape)).astype(np_dtype(dtype))


def reduce_ref(inputs: list[np.ndarray], op: str, dtype: str) -> np.ndarray:
    """Expected all-reduce result; floats computed in float64 (compare with tolerance)."""
    if dtype in FLOAT_DTYPES:
        stack = np.stack([x.astype(np.float64) for x in inputs])
        fn = {"sum": np.sum, "mean": np.mean, "min": np.min, "max": np.max, "prod": np.prod}[op]
        return fn(stack, axis=0)
    dt = np_dtype(dtype)
    stack = np.stack(inputs)
    if op == "sum":
        return np.sum(stack, axis=0, dtype=dt)  # wraps like fixed-width integers
    if op == "prod":
        return np.prod(stack, axis=0, dtype=dt)
    return {"min": np.min, "max": np.max}[op](stack, axis=0)


def tolerance(dtype: str, size: int) -> float:
    """Absolute tolerance for a float sum/mean of ``size`` inputs in [-1, 1)."""
    eps = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}[dtype]
    # Each of the (size - 1) additions rounds a partial sum of magnitude <= size
    # by at most eps * size / 2 (the reference uses the already-rounded inputs);
    # twice that bound, to cover the rounding of a final division (mean).
    return eps * size * size


class Checker:
    """Counts checks; the first mismatch ends the worker with a message."""

    def __init__(self, rank: int):
        self.rank = rank
        self.count = 0

    def fail(self, what: str, detail: str = "") -> None:
        print(f"MISMATCH on rank {self.rank}: {what}\n{detail}", file=sys.stderr, flush=True)
        sys.exit(1)

    def true(self, cond: bool, what: str) -> None:
        if not cond:
            self.fail(what)
        self.count += 1

    def equal(self, got, want, what: str) -> None:
        got_a = np.asarray(got)
        want_a = np.asarray(want)
        if got_a.shape != want_a.shape:
            self.fail(what, f"shape {got_a.shape} != expected {want_a.shape}")
        if got_a.dtype.kind == "V" or want_a.dtype.kind == "V" or str(got_a.dtype) == "bfloat16":
            got_a = got_a.astype(np.float64)
            want_a = want_a.astype(np.float64)
        if not np.array_equal(got_a, want_a):
            self.fail(what, _diff(got_a, want_a))
        self.count += 1

    def close(self, got, want, atol: float, what: str) -> None:
        got_a = np.asarray(got).astype(np.float64)
        want_a = np.asarray(want).astype(np.float64)
        if got_a.shape != want_a.shape:
            self.fail(what, f"shape {got_a.shape} != expected {want_a.shape}")
        if not np.allclose(got_a, want_a, rtol=0.0, atol=atol):
            self.fail(what, _diff(got_a, want_a) + f"\natol {atol}")
        self.count += 1

    def done(self) -> None:
        print(f"checked {self.count} results", flush=True)


def _diff(got: np.ndarray, want: np.ndarray) -> str:
    flat_g, flat_w = got.reshape(-1), want.reshape(-1)
    bad = np.nonzero(flat_g != flat_w)[0] if got.dtype.kind != "f" else np.nonzero(~np.isclose(flat_g, flat_w))[0]
    first = bad[:5].tolist()
    return (
        f"{len(bad)} of {flat_g.size} elements differ; first at {first}: "
        f"got {flat_g[first].tolist()} want {flat_w[first].tolist()}"
    )
