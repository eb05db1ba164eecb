"""Worker for tests/test_auto_search.py: trials agree on every worker (np = 2).

Usage: auto_trials.py

Real collectives, stand-in switch and step functions whose behaviour differs
by rank, so that each rule of kungfu_tf/strategy/auto/trials.py is checked
against what the other worker did:

* a switch that raises on rank 1 only fails the trial on both ranks (rank 0
  runs none of its steps, and says another worker failed);
* a step that raises on rank 1 only (its second step) fails the trial on
  both ranks after the same number of steps;
* the measured time is the slowest worker's: rank 1 sleeps SLEEP per step,
  rank 0 does not; both get the same number, at least SLEEP;
* workers given different candidates get a StrategyError on both ranks.
"""

from __future__ import annotations

import time

import _setup
from _setup import Checker

from kungfu_tf.proto import strategy_pb2
from kungfu_tf.strategy import StrategyError
from kungfu_tf.strategy.auto.trials import TrialRunner, agree_max

SLEEP = 0.05


def main() -> None:
    rank = _setup.env_rank()
    chk = Checker(rank)
    candidate = strategy_pb2.Strategy(id="candidate")
    candidate.node_config.add(var_name="w").all_reduce.group = 0

    def switch_fails_on_1(s):
        if rank == 1:
            raise StrategyError("node 'w': no such variable here")

    steps = []
    r = TrialRunner(switch_fails_on_1, lambda: steps.append(1), warmup=1, trial_steps=2).run(0, candidate)
    chk.true(r.failed, "a switch failed on rank 1: the trial must fail everywhere")
    chk.equal(len(steps), 0, "steps run after a failed switch")
    want = "switch: StrategyError: node 'w': no such variable here" if rank == 1 else "another worker failed (switch)"
    chk.equal(r.error, want, "error")

    steps.clear()

    def step_fails_on_1_at_1():
        steps.append(1)
        if rank == 1 and len(steps) == 2:
            raise RuntimeError("out of memory")

    r = TrialRunner(lambda s: None, step_fails_on_1_at_1, warmup=1, trial_steps=3).run(1, candidate)
    chk.true(r.failed, "a step failed on rank 1: the trial must fail everywhere")
    chk.equal(len(steps), 2, "steps run by each rank before the failure was agreed")

    def slow_on_1():
        if rank == 1:
            time.sleep(SLEEP)

    r = TrialRunner(lambda s: None, slow_on_1, warmup=1, trial_steps=2).run(2, candidate)
    chk.true(not r.failed and r.seconds_per_step >= SLEEP, f"the slowest worker's time, got {r.seconds_per_step}")
    chk.equal(agree_max(-r.seconds_per_step, "check/neg"), -r.seconds_per_step, "the same measurement on both ranks")
    chk.true(r.wall_seconds >= 3 * SLEEP, f"the trial's wall time covers its steps, got {r.wall_seconds}")

    mine = strategy_pb2.Strategy(id=f"candidate-of-{rank}")
    try:
        TrialRunner(lambda s: None, lambda: None, warmup=0, trial_steps=1).run(3, mine)
        chk.fail("different candidates", "the trial ran with different candidates")
    except StrategyError as e:
        chk.true("do not hold the same trial candidate" in str(e), f"unclear message: {e}")
    chk.done()


if __name__ == "__main__":
    main()
