"""The same-host transport: shared-memory rings by default, Unix sockets with KUNGFU_SHM=0.

Real kungfu-run jobs (tests/workers/shm_transport.py) sum tensors from one
element to several rings' worth in a tf.function, checked against numpy on
every rank. Which transport carried the frames is read from each worker's
own memory map (the rings are memfds named "kungfu-shm-ring"), not from
anything the runtime says about itself. A value of KUNGFU_SHM other than
0 or 1 stops the job with an error naming the variable.
"""

from __future__ import annotations

import re

import pytest
from conftest import assert_job_ok, describe, rank_lines, run_job, worker_env

CHECKS = 6  # 3 sizes x 2 calls


def rings_per_rank(out: str) -> dict[int, int]:
    found = {}
    for rank, lines in rank_lines(out).items():
        for line in lines:
            m = re.fullmatch(r"rings (\d+)", line)
            if m:
                found[rank] = int(m.group(1))
    return found


@pytest.mark.parametrize("np_", [2, 3])
def test_same_host_peers_use_shared_memory_by_default(np_):
    rc, out, err = run_job(np_, "shm_transport.py", timeout=240)
    assert_job_ok(rc, out, err, np_, CHECKS)
    rings = rings_per_rank(out)
    # Each worker writes one ring to every peer it sends to and maps the
    # ring of every peer that sends to it: at least one of each here.
    assert sorted(rings) == list(range(np_)), describe(rc, out, err)
    assert all(n >= 2 for n in rings.values()), f"rings mapped per rank: {rings}\n" + describe(rc, out, err)


def test_kungfu_shm_0_forces_unix_sockets():
    rc, out, err = run_job(2, "shm_transport.py", timeout=240, env=worker_env(KUNGFU_SHM="0"))
    assert_job_ok(rc, out, err, 2, CHECKS)
    assert rings_per_rank(out) == {0: 0, 1: 0}, describe(rc, out, err)


def test_bad_kungfu_shm_value_is_a_clear_error():
    rc, out, err = run_job(2, "shm_transport.py", timeout=240, env=worker_env(KUNGFU_SHM="yes"))
    assert rc != 0, describe(rc, out, err)
    assert "KUNGFU_SHM='yes'" in err, describe(rc, out, err)
    assert "checked" not in out, describe(rc, out, err)
