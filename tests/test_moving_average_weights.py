"""Keras's ``use_ema=True`` under parameter servers: ``fit`` ends with every worker's weights at their moving
averages, as one process's (tests/workers/ema_fit.py at np=2, against one process on the union batches).

Before, ``finalize_variable_values`` (what ``fit`` calls when training ends) paired the model's variables
with the averages of what the worker owned: a shape mismatch on one rank, another variable's average on the
other. The training itself, ``ema_overwrite_frequency`` included, already matched one process.
"""

from __future__ import annotations

import pytest
from conftest import assert_job_ok, run_job


@pytest.mark.parametrize("strategy, overwrite_every, optimizer", [
    ("PSLoadBalancing", None, "sgd"), ("PartitionedPS", 2, "sgd"), ("AllReduce", None, "sgd"),
    ("PS", None, "adafactor")])  # fmt: skip
def test_fit_ends_at_the_moving_averages_of_one_process(strategy, overwrite_every, optimizer):
    # Adafactor: its averages sit among factored slots (not of their variables' shapes), which PS gathers too.
    args = [strategy, "-" if overwrite_every is None else str(overwrite_every), optimizer]
    rc, out, err = run_job(2, "ema_fit.py", *args, timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=8)


def test_averages_that_cannot_be_gathered_are_refused_on_every_worker():
    # Adafactor under PartitionedPS: a shard's factored slots are not a cut of its variable's. Before, the ranks
    # that owned variables raised in finalize_variable_values and the others waited in a collective until the
    # job was killed.
    rc, out, err = run_job(2, "ema_fit.py", "refused", timeout=180)
    assert_job_ok(rc, out, err, 2, expected_checks=1)
