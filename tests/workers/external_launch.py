"""Worker for tests/test_external_launch.py, started by mpirun (or as a fabricated srun task).

Usage: external_launch.py check|die

No kungfu-run: the job comes from the launcher's variables
(kungfu_tf.run.worker_env.external_launch). ``check`` compares rank, size, local rank
and local size with the launcher's own numbers, and all_reduce, broadcast
and SYNC_STEPS steps of SynchronousSGDOptimizer with numpy; ends with
"checked N results". ``die``: after one all-reduce, rank 1 kills itself
with SIGKILL and the others run another all-reduce, which must fail;
they print "PEER LOST at <time> on rank <r>: <error>" and exit 3.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import _setup
import keras
from _setup import Checker, np, ops, tf

import kungfu_tf
from kungfu_tf.optimizers import SynchronousSGDOptimizer

# One thread each (_setup allows 2 inter-op): 3 workers share the 2 cores of CI.
tf.config.threading.set_inter_op_parallelism_threads(1)

SYNC_STEPS = 3
B, FEATURES = 4, 3  # per-worker batch rows, features of the linear model
LR = 0.1


def launcher_numbers() -> tuple[int, int, int, int]:
    """(rank, size, local rank, local size) as the launcher itself says."""
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        keys = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                "OMPI_COMM_WORLD_LOCAL_SIZE")
        return tuple(int(os.environ[k]) for k in keys)  # type: ignore[return-value]
    rank, size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    return rank, size, int(os.environ["SLURM_LOCALID"]), size  # the tests' Slurm steps run on one node


def rank_input(rank: int) -> np.ndarray:
    return np.random.default_rng(_setup.seed_of("external", rank)).uniform(-1, 1, 5).astype(np.float32)


def check_collectives(chk: Checker, rank: int, size: int) -> None:
    got = ops.all_reduce(tf.constant(rank_input(rank)), op="sum").numpy()
    want = np.sum([rank_input(r).astype(np.float64) for r in range(size)], axis=0)
    chk.close(got, want, _setup.tolerance("float32", size), "all_reduce sum")
    root = size - 1
    got = ops.broadcast(tf.constant(rank_input(rank)), root=root).numpy()
    chk.equal(got, rank_input(root), f"broadcast from rank {root}")


def check_sync_sgd(chk: Checker, rank: int, size: int) -> None:
    """Linear least squares: averaged gradients == numpy's gradient on the union."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(SYNC_STEPS, size, B, FEATURES)).astype(np.float32)
    y = rng.normal(size=(SYNC_STEPS, size, B, 1)).astype(np.float32)
    w0 = rng.normal(size=(FEATURES, 1)).astype(np.float32)

    w = tf.Variable(w0)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(LR))

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(xb, w) - yb))
        opt.apply_gradients([(tape.gradient(loss, w), w)])

    want = w0.astype(np.float64)
    for s in range(SYNC_STEPS):
        step(x[s, rank], y[s, rank])
        xs, ys = x[s].reshape(-1, FEATURES).astype(np.float64), y[s].reshape(-1, 1).astype(np.float64)
        want = want - LR * 2.0 / len(xs) * xs.T @ (xs @ want - ys)
    chk.close(w.numpy(), want, 1e-5, f"weights after {SYNC_STEPS} synchronous SGD steps")


def check(rank: int, size: int, local_rank: int, local_size: int) -> None:
    chk = Checker(rank)
    chk.true(kungfu_tf.rank() == rank, f"kungfu_tf.rank() {kungfu_tf.rank()} != launcher's {rank}")
    chk.true(kungfu_tf.size() == size, f"kungfu_tf.size() {kungfu_tf.size()} != launcher's {size}")
    chk.true(kungfu_tf.local_rank() == local_rank, f"local_rank() {kungfu_tf.local_rank()} != {local_rank}")
    chk.true(kungfu_tf.local_size() == local_size, f"local_size() {kungfu_tf.local_size()} != {local_size}")
    check_collectives(chk, rank, size)
    check_sync_sgd(chk, rank, size)
    chk.done()


def die(rank: int) -> None:
    # mpirun answers a rank's death by terminating the others (SIGTERM, then
    # SIGKILL after odls_base_sigkill_timeout). Ignoring SIGTERM keeps that
    # from racing the runtime's own error, which is what this checks.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ops.all_reduce(tf.constant([1.0]), name="before").numpy()
    if rank == 1:
        print(f"rank 1 kills itself at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        ops.all_reduce(tf.constant([1.0]), name="after").numpy()
    except tf.errors.OpError as e:
        message = " ".join(str(e).split())
        print(f"PEER LOST at {time.time():.3f} on rank {rank}: {message}", flush=True)
        sys.exit(3)
    print(f"MISMATCH on rank {rank}: the all-reduce after rank 1 died succeeded", flush=True)
    sys.exit(1)


def main() -> None:
    rank, size, local_rank, local_size = launcher_numbers()
    if sys.argv[1] == "check":
        check(rank, size, local_rank, local_size)
    else:
        die(rank)


if __name__ == "__main__":
    main()
