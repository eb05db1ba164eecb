"""Worker for test_stale_copies.py (``kungfu-run -np 3``): the copies of an asynchronous parameter server.

``SynchronousSGDOptimizer(SGD(0.1), strategy=PS(sync=False))``: rank 0 owns
both variables, every worker pushes its gradients and fetches rank 0's newest
value. After STEPS steps on every worker and a barrier, rank 0 alone runs one
more step (its own push, taken and applied): the other ranks' copies are now
strictly older than the owner's value. Checked:

* ``sync_stale_copies``: before it rank 1's copy differs from rank 0's value;
  after it every rank holds rank 0's value bit for bit.
* ``switch_strategy(opt, "AllReduce")`` after the same divergence: the new
  plan starts from the owner's values on every worker (before, each worker
  kept its own copy and the all-reduced steps then kept them apart: the
  workers' weights never met again). After two all-reduced steps every
  rank's weights are equal. The replaced plan's blobs (and accumulators,
  clocks) are gone from the owner's store: before, every change and switch
  left them there, four versions of every value (a leak for a long job).
* Two live optimizers with stale parameter servers and one ``name=``: the
  second is refused when it builds; once the first is gone, a third of that
  name builds, and the first one's blobs are gone from rank 0's store.
* The values move bit for bit: the owner's -0.0 stays -0.0 on every worker
  (a float sum of the owner's part and the others' zeros gave 0.0).
* Under ``PartitionedPS(sync=False)`` each rank owns a shard of the (9, 3)
  kernel in a shard variable of its own, cut from the model variable at the
  start of each step: the model variables hold the truth between steps.
  Each worker assigns its own values to them (a ``set_weights``), then
  ``sync_stale_copies``: every worker ends with each shard's owner's values
  (a version that read the owners' shard variables gave back the values
  from before the assignment).

Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np, ops, tf

from kungfu_tf.ops import p2p
from kungfu_tf.optimizers import (
    SynchronousSGDOptimizer,
    switch_strategy,
    sync_stale_copies,
)
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.errors import StrategyError

STEPS = 4
SHAPES = [(8, 3), (3,)]


def gradients(step: int, rank: int) -> list[tf.Tensor]:
    rng = np.random.default_rng(1000 * step + rank)
    return [tf.constant(rng.standard_normal(shape).astype(np.float32)) for shape in SHAPES]


def owners_values(variables: list[keras.Variable], name: str) -> list[np.ndarray]:
    return [ops.broadcast(tf.convert_to_tensor(v), root=0, name=f"{name}/{i}").numpy() for i, v in enumerate(variables)]


def everyone_equal(check: Checker, variables: list[keras.Variable], name: str, what: str) -> None:
    want = owners_values(variables, name)
    for v, w in zip(variables, want):
        check.equal(v.numpy().tobytes() == w.tobytes(), True, f"{what}: {v.name} is rank 0's bit for bit")


def stored_at_rank_0(name: str, like: keras.Variable) -> bool:
    """Whether rank 0's store holds blob ``name``."""
    try:
        p2p.request(0, name, like=tf.zeros(like.shape, like.dtype))
        return True
    except tf.errors.NotFoundError:
        return False


def diverge(rank: int, opt: SynchronousSGDOptimizer, variables: list[keras.Variable], name: str) -> None:
    """STEPS steps everywhere, then one more on rank 0 (the owner) alone."""
    for s in range(STEPS):
        opt.apply(gradients(s, rank), variables)
    ops.all_reduce(tf.zeros([1]), name=f"{name}/barrier_before")
    if rank == 0:
        opt.apply(gradients(STEPS, rank), variables)
    ops.all_reduce(tf.zeros([1]), name=f"{name}/barrier_after")


def main() -> None:
    rank = env_rank()
    check = Checker(rank)

    variables = [keras.Variable(np.ones(shape, np.float32), name=f"a{i}") for i, shape in enumerate(SHAPES)]
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.PS(sync=False), name="async_a")
    diverge(rank, opt, variables, "a")
    owner = owners_values(variables, "a/owner")
    differs = any(v.numpy().tobytes() != w.tobytes() for v, w in zip(variables, owner))
    check.equal(differs, rank != 0, "before sync_stale_copies: only the owner holds its newest value")
    check.equal(sync_stale_copies(opt), [0, 1], "the variables of the asynchronous parameter server")
    everyone_equal(check, variables, "a/after", "after sync_stale_copies")

    variables = [keras.Variable(np.ones(shape, np.float32), name=f"b{i}") for i, shape in enumerate(SHAPES)]
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1, momentum=0.9), strategy=builders.PS(sync=False),
                                  name="async_b")  # fmt: skip
    diverge(rank, opt, variables, "b")
    value_blob = f"{opt._kungfu_plan._keys}/v0/s0/value"  # rank 0's newest value of the first variable
    check.equal(stored_at_rank_0(value_blob, variables[0]), True, "before the switch: rank 0 holds its value blob")
    switch_strategy(opt, "AllReduce")
    everyone_equal(check, variables, "b/switched", "right after the switch to AllReduce")
    check.equal(stored_at_rank_0(value_blob, variables[0]), False, "the replaced plan's blobs are forgotten")
    for s in range(2):
        opt.apply(gradients(STEPS + 1 + s, rank), variables)
    everyone_equal(check, variables, "b/trained", "after two all-reduced steps")

    variables = [keras.Variable(np.ones(shape, np.float32), name=f"c{i}") for i, shape in enumerate(SHAPES)]
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.PS(sync=False), name="async_c")
    diverge(rank, opt, variables, "c")
    if rank == 0:
        variables[1].assign(np.array([-0.0, 1e-40, 2.0], np.float32))  # a negative zero and a denormal
    owner = owners_values(variables, "c/owner")
    sync_stale_copies(opt)
    for v, w in zip(variables, owner):
        check.equal(v.numpy().tobytes() == w.tobytes(), True, f"{v.name} is the owner's, -0.0 and denormal too")

    shapes = [(9, 3), (3,)]
    variables = [keras.Variable(np.ones(shape, np.float32), name=f"d{i}") for i, shape in enumerate(shapes)]
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), name="async_d",
                                  strategy=builders.PartitionedPS(min_partition_bytes=64, sync=False))  # fmt: skip
    for s in range(STEPS):
        opt.apply([tf.constant(np.full(shape, s + rank, np.float32)) for shape in shapes], variables)
    ops.all_reduce(tf.zeros([1]), name="d/barrier")
    variables[0].assign(np.full(shapes[0], 100.0 + rank, np.float32))  # each worker's own set_weights
    want = np.zeros(shapes[0], np.float32)
    shards = 0
    for vi, node, target in opt._kungfu_plan.placements():
        if vi == 0 and node.is_shard and node.owner == rank and target is not None:
            want[slice(*node.bounds)] = 100.0 + rank
            shards += 1
    check.equal(shards, 1, "PartitionedPS: this rank owns one shard of the kernel")
    want = ops.all_reduce(tf.constant(want), op="sum", name="d/want").numpy()  # every owner's assigned shard
    sync_stale_copies(opt)
    check.equal(variables[0].numpy().tobytes() == want.tobytes(), True,
                "PartitionedPS: the kernel is its owners' values as assigned between steps")  # fmt: skip

    # Two live optimizers of one name would share their stale data in the stores: the second is refused when it
    # builds (before, it trained on the first one's blobs). One that is gone leaves its data behind: the next
    # optimizer of its name forgets them (before, its first fetches took the old plan's newer versions).
    shared = [keras.Variable(np.ones(shape, np.float32), name=f"e{i}") for i, shape in enumerate(SHAPES)]
    first = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.PS(sync=False), name="shared")
    diverge(rank, first, shared, "e")
    value_blob = f"{first._kungfu_plan._keys}/v0/s0/value"
    second = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.PS(sync=False), name="shared")
    try:
        second.build(shared)
        refused = ""
    except StrategyError as e:
        refused = str(e)
    check.equal("share the name 'shared'" in refused, True, f"a second live optimizer of one name is refused: {refused}")
    del first, second
    third = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=builders.PS(sync=False), name="shared")
    third.build([keras.Variable(np.ones(shape, np.float32), name=f"f{i}") for i, shape in enumerate(SHAPES)])
    check.equal(stored_at_rank_0(value_blob, shared[0]), False, "a gone optimizer's blobs are forgotten")
    check.done()


if __name__ == "__main__":
    main()
