"""Worker for tests/test_strategy_training.py: workers with different strategies fail clearly.

Usage: strategy_mismatch.py   (np = 2)

Rank 0 asks for all-reduce, rank 1 for a parameter server. Before the first
step, every worker must raise StrategyError saying the strategies differ
(from the consensus on the strategy bytes), instead of hanging or training
with mismatched collectives.
"""

from __future__ import annotations

import _setup
import keras
from _setup import Checker, np

from kungfu_tf.optimizers import SynchronousSGDOptimizer
from kungfu_tf.strategy import StrategyError, builders


def main() -> None:
    rank = _setup.env_rank()
    chk = Checker(rank)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    strategy = builders.AllReduce() if rank == 0 else builders.PS(owner=0)
    opt = SynchronousSGDOptimizer(keras.optimizers.SGD(0.1), strategy=strategy)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    try:
        model.fit(np.ones((4, 3), np.float32), np.ones((4, 2), np.float32), verbose=0)
        chk.fail("mismatch", "training started with different strategies")
    except StrategyError as e:
        # Detected by the strategy check, not ended by a timeout (that raises
        # DeadlineExceededError, not StrategyError): no clock bound needed.
        chk.true("do not hold identical strategies" in str(e), f"unclear message: {e}")
    chk.done()


if __name__ == "__main__":
    main()
