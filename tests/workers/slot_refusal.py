"""Worker for test_slot_replica_publish.py (``kungfu-run --elastic -np 2``): slots that cannot move.

In an elastic job with parameter servers a worker's optimizer slots must
follow their variables to new owners at a membership change. Keras's
Adafactor keeps a matrix's second moment factored (its row and column sums):
whole variables move with them, but a partitioned one cannot (a shard's
factored slots are not cut from its variable's). Under PartitionedPS (the
kernel cut in two, one shard per rank) it must be refused on every worker,
with the same error, when it is built (before it trains). Rank 0, whose shard's
slots alone are checked first, raised while rank 1 waited for it.

After the refusal, a step with the same optimizer (a caller that caught the
error) is refused again rather than training without replicas.

Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import builders
from kungfu_tf.strategy.errors import StrategyError

CASES = [
    ("adafactor", lambda: keras.optimizers.Adafactor(0.01), builders.PartitionedPS(min_partition_bytes=64)),
]
REFUSAL = "cannot train with parameter servers in an elastic job"


def main() -> None:
    check = Checker(env_rank())
    for name, make, strategy in CASES:
        variables = [keras.Variable(np.ones([16, 3], np.float32), name=f"{name}_kernel"),
                     keras.Variable(np.ones([3], np.float32), name=f"{name}_bias")]  # fmt: skip
        opt = SynchronousSGDOptimizer(make(), strategy=strategy, name=name)
        try:
            opt.build(variables)
            check.fail(f"{name}: built without a refusal")
        except StrategyError as e:
            check.true(REFUSAL in str(e), f"{name}: the refusal names the cause: {e}")
        grads = [tf.ones_like(v) for v in variables]
        try:
            opt.apply(grads, variables)
            check.fail(f"{name}: a step after the refusal ran")
        except StrategyError as e:
            check.true(REFUSAL in str(e), f"{name}: the step is refused too: {e}")
        check.equal(variables[0].numpy(), np.ones([16, 3], np.float32), f"{name}: nothing was trained")
    print(f"checked {check.count} results", flush=True)


if __name__ == "__main__":
    main()
