"""set_topology while collectives run (tests/workers/set_topology.py), np=4.

18 steps of a tf.function with 20 concurrent all-reduces (up to 300001
elements, i.e. several 1 MiB chunks) on new data each step; every 3 steps all
workers switch to the next topology (RING, BINARY_TREE, STAR, CLIQUE,
BINARY_TREE_STAR, AUTO), alternately eagerly and inside a tf.function that
then runs the all-reduces under a control dependency. Every result and
topology() (eagerly and inside the tf.function) are checked.

Then: workers asking for different topologies get False everywhere and the
old topology stays (eagerly, and with only the last worker differing inside
the tf.function); names differing only in case agree.
"""

from __future__ import annotations

from conftest import assert_job_ok, describe, rank_lines, run_job

NP = 4
STEPS = 18
SWITCHES = 6
ALL_REDUCES = 20


def expected_checks() -> int:
    per_step = ALL_REDUCES + 1  # results + topology() inside the tf.function
    checks = 1  # initial topology
    checks += STEPS * per_step + SWITCHES * 2  # + True from set_topology, topology() after
    checks += 2 + per_step  # disagreement: False, topology unchanged, a step
    checks += 2 + per_step  # mixed-case agreement: True, CLIQUE, a step
    checks += 1 + per_step + 1  # disagreement inside the tf.function
    return checks


def test_set_topology_between_steps():
    rc, out, err = run_job(NP, "set_topology.py", timeout=180)
    assert_job_ok(rc, out, err, NP, expected_checks())
    for r, lines in rank_lines(out).items():
        assert f"{STEPS} steps, {SWITCHES} switches" in " ".join(lines), f"rank {r}\n" + describe(rc, out, err)
