"""Worker for tests/test_cpu_binding.py: every thread of this worker is pinned to one core, its own.

Usage: cpu_binding.py   (any np, KUNGFU_BIND_TO=core)

Once the op library is loaded (``kungfu_tf.size()``) and an all-reduce ran
(the runtime's and TensorFlow's threads exist), every thread of the process
must have the same single-core mask, and the workers' cores must differ
(all-gathered), up to the number of cores the job may use.
"""

from __future__ import annotations

import os

import _setup
from _setup import Checker, np, tf

import kungfu_tf
from kungfu_tf import ops


def thread_masks() -> set[frozenset[int]]:
    masks = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            masks.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            pass
    return masks


def main() -> None:
    rank, size = _setup.env_rank(), _setup.env_size()
    chk = Checker(rank)
    allowed = int(os.environ["CPU_BINDING_TEST_CORES"])  # the cores the launcher could use
    total = ops.all_reduce(tf.constant([1.0]))
    chk.equal(float(total.numpy()[0]), float(kungfu_tf.size()), "an all-reduce ran")
    masks = thread_masks()
    chk.equal(len(masks), 1, f"every thread has the same mask: {sorted(map(sorted, masks))}")
    (mask,) = masks or {frozenset()}
    chk.equal(len(mask), 1, f"the mask is one core: {sorted(mask)}")
    core = next(iter(mask), -1)
    cores = ops.all_gather(tf.constant([core], tf.int32)).numpy().reshape(-1)
    chk.equal(len(set(cores.tolist())), min(size, allowed), f"the workers' cores differ: {cores.tolist()}")
    print(f"pinned to core {core} with {np.int64(len(os.listdir('/proc/self/task')))} threads", flush=True)
    chk.done()


if __name__ == "__main__":
    main()
