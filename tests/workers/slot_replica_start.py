"""Worker for test_slot_replica_publish.py (``kungfu-run --elastic -np 2``): a fresh optimizer's slot replicas.

``SynchronousSGDOptimizer(opt, strategy="PSLoadBalancing")`` built on two
variables puts one on each worker; each keeps a replica of the other's
optimizer slots (``StrategyPlan.keep_slot_replicas``). Before the first step
they must hold what the owner's slots hold: Adagrad's accumulator starts at
its ``initial_accumulator_value``, Ftrl's accumulator too (its linear at 0).
They started at zeros, and an owner SIGKILLed in the first step (before its
first publish) left its successor accumulators of 0 where one process has
0.25: the first update then divided by the gradient's own size.

Ends with "checked N results".
"""

from __future__ import annotations

import keras
from _setup import Checker, env_rank, np

from kungfu_tf.optimizers import SynchronousSGDOptimizer

CASES = [
    ("adagrad", lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25), [0.25]),
    ("ftrl", lambda: keras.optimizers.Ftrl(0.1, initial_accumulator_value=0.5), [0.5, 0.0]),
]


def main() -> None:
    check = Checker(env_rank())
    variables = [keras.Variable(np.ones([8, 3], np.float32), name="kernel"),
                 keras.Variable(np.ones([3], np.float32), name="bias")]  # fmt: skip
    for name, make, starts in CASES:
        opt = SynchronousSGDOptimizer(make(), strategy="PSLoadBalancing", name=name)
        opt.build(variables)  # as ElasticState does, before the first step
        replicas = opt._kungfu_plan.slot_replicas
        check.true(len(replicas) == 1, f"{name}: one replica unit per worker, got {sorted(replicas)}")
        for (vi, ui), kinds in replicas.items():
            check.true(len(kinds) == len(starts), f"{name}: {len(kinds)} slot kinds, expected {len(starts)}")
            for k, (replica, start) in enumerate(zip(kinds, starts)):
                want = np.full(tuple(replica.shape), start, np.float32)
                check.equal(replica.numpy(), want, f"{name}: replica of variable {vi} unit {ui}, slot kind {k}")
    print(f"checked {check.count} results", flush=True)


if __name__ == "__main__":
    main()
