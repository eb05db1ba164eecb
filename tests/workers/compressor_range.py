"""Worker for test_compression.py (np=2): compressed all-reduce near and beyond float16's range.

Usage: compressor_range.py

1. For fp16, fp16-ef, bf16 and bf16-ef: STEPS steps of SGD on a variable
   whose gradient is 40000 on every worker in some elements (the sum, 80000,
   is beyond float16's 65504; the average is not) must end where numpy puts
   it, w = -STEPS * LR * mean(gradients), within the wire dtype's rounding.
2. For fp16 and fp16-ef: a gradient of 70000 on every worker (the shares fit,
   their sum does not), then a NaN gradient on rank 1 only, each raise
   InvalidArgumentError on *every* worker, naming the variable; the variable
   is unchanged, the error-feedback residual stays finite, and the next
   ordinary step is exact.

Ends with "checked N results" (4 + 2 * (2 errors + 2 unchanged + 2 residuals + 1 next step) = 18).
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, env_size, np, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders

STEPS, LR = 3, 1e-3
# Relative rounding the result may carry: the share's cast and the one addition
# of two shares each round by at most one unit roundoff (2^-11 fp16, 2^-8 bf16).
RTOL = {"fp16": 2 * 2.0**-11, "fp16-ef": 2 * 2.0**-11, "bf16": 2 * 2.0**-8, "bf16-ef": 2 * 2.0**-8}


def gradient(rank: int) -> np.ndarray:
    return np.array([40000.0, -40000.0, 1.0 + rank, 30000.0 + 10000.0 * rank], np.float32)


def trainer(compressor: str, name: str):
    v = keras.Variable(np.zeros([4], np.float32), name=name)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(LR), strategy=builders.AllReduce(compressor=compressor), name=name)

    @tf.function
    def step(g):
        opt.apply_gradients([(g, v)])

    return v, opt, step


def residual_of(opt) -> np.ndarray | None:
    residual = opt._kungfu_plan._plans[0].units[0].compressor.residual
    return None if residual is None else np.asarray(residual.numpy())


def main() -> None:
    rank, size = env_rank(), env_size()
    chk = Checker(rank)
    mean = np.mean([gradient(r).astype(np.float64) for r in range(size)], axis=0)
    for compressor in ("fp16", "fp16-ef", "bf16", "bf16-ef"):
        v, _, step = trainer(compressor, f"range_{compressor.replace('-', '_')}")
        for _ in range(STEPS):
            step(tf.constant(gradient(rank)))
        want = -STEPS * LR * mean
        got = v.numpy().astype(np.float64)
        ok = np.all(np.isfinite(got)) and np.allclose(got, want, rtol=RTOL[compressor], atol=0.0)
        chk.true(ok, f"{compressor}: weights {got.tolist()}, numpy {want.tolist()}")

    for compressor in ("fp16", "fp16-ef"):
        name = f"overflow_{compressor.replace('-', '_')}"
        v, opt, step = trainer(compressor, name)
        bad = {
            "sum beyond 65504": np.full([4], 70000.0, np.float32),
            "NaN on rank 1": np.full([4], np.nan if rank == 1 else 1.0, np.float32),
        }
        for what, g in bad.items():
            try:
                step(tf.constant(g))
            except tf.errors.InvalidArgumentError as e:
                text = str(e)
                chk.true(
                    f"averaged gradient of '{name}" in text and "is not finite" in text,
                    f"{compressor} {what}: the error names the variable: {text[-600:]}",
                )
            else:
                chk.fail(f"{compressor} {what}: no InvalidArgumentError, weights {v.numpy().tolist()}")
            chk.equal(v.numpy(), np.zeros([4], np.float32), f"{compressor} {what}: weights unchanged")
            residual = residual_of(opt)
            chk.true(residual is None or bool(np.all(np.isfinite(residual))), f"{compressor} {what}: residual {residual}")
        step(tf.constant(np.ones([4], np.float32)))
        chk.equal(v.numpy(), np.full([4], -LR, np.float32), f"{compressor}: the step after the errors")
    chk.done()


if __name__ == "__main__":
    main()
