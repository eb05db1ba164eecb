"""Worker for test_slot_replica_publish.py (``kungfu-run --elastic -np 2``): optimizers whose slots cannot move.

In an elastic job with parameter servers a worker's optimizer slots must
follow their variables to new owners at a membership change. Two Keras
optimizers cannot, and each must be refused on every worker, with the same
error, when it is built (before it trains):

* Adafactor under PS (rank 0 owns both variables): its factored moments do
  not have the variables' shapes. Rank 0 raised, rank 1 (owning nothing)
  waited for it.
* Muon under PSLoadBalancing (rank 0 owns the matrix, rank 1 the bias): one
  slot for matrices, two for the rest. Each rank alone looked consistent;
  rank 0 then failed with an IndexError and rank 1 waited in a broadcast.

After the refusal, a step with the same optimizer (a caller that caught the
error) is refused again rather than training without replicas.

Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np, tf

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy.errors import StrategyError

CASES = [
    ("adafactor", lambda: keras.optimizers.Adafactor(0.01), "PS"),
    ("muon", lambda: keras.optimizers.Muon(0.01), "PSLoadBalancing"),
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
