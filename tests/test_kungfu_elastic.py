"""KungFu's elastic programs on kungfu_tf with renames only: plain-process joiners, a synchronous grow, detached().

* tests/workers/kungfu_elastic_eager.py is KungFu's examples/mnist_elastic_eager
  in shape (no ElasticState; ``resize`` in a ``tf.function`` on a schedule of
  steps, ``broadcast_variables`` after every change, ``detached()`` ends the
  loop), started by ``kungfu-run --elastic -np 1 --max-np 4``: 1 -> 2 -> 4 -> 3.
  The first joiner SIGKILLs itself before its first collective; the launcher
  starts another and the grow still completes.
* A joiner that warms up for ``ElasticState.join`` is never rank 0 before
  its admission (the place it would take).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import numpy as np
from conftest import describe, run_job, worker_env

from kungfu_tf.run.control.config_server import ConfigClient, ConfigServer, make_cluster
from kungfu_tf.run.control.job_state import PLAIN_SIGNATURE, signature_difference
from kungfu_tf.run.control.peer_string import parse_peer_string
from kungfu_tf.run.plan.ports import find_free_ports

DIM, BATCH, LR, MOMENTUM = 4, 12, 0.05, 0.9  # as in tests/workers/kungfu_elastic_eager.py
TRUE_W = np.array([1.0, -2.0, 0.5, 3.0])
STEPS, SCHEDULE = 12, {3: 2, 6: 4, 9: 3}


def reference(init: np.ndarray, steps: int) -> np.ndarray:
    """One process, numpy: momentum SGD on each step's whole global batch, from ``init`` (rank 0's)."""
    w, b = init[:DIM].copy(), float(init[DIM])
    vw, vb = np.zeros(DIM), 0.0
    for step in range(steps):
        rng = np.random.default_rng(1000 + step)
        x = rng.normal(size=(BATCH, DIM))
        y = x @ TRUE_W + 0.1 * rng.normal(size=BATCH)
        err = x @ w + b - y
        gw, gb = 2 * x.T @ err / BATCH, 2 * err.sum() / BATCH
        vw, vb = MOMENTUM * vw - LR * gw, MOMENTUM * vb - LR * gb
        w, b = w + vw, b + vb
    return np.append(w, b)


def size_at(step: int) -> int:
    size = 1
    for at, n in sorted(SCHEDULE.items()):
        if step >= at:
            size = n
    return size


def test_a_kungfu_elastic_script_grows_and_shrinks_on_its_schedule_with_plain_joiners(tmp_path):
    records_dir = tmp_path / "records"
    records_dir.mkdir()
    schedule = ",".join(f"{k}:{v}" for k, v in SCHEDULE.items())
    rc, out, err = run_job(
        1, "kungfu_elastic_eager.py", STEPS, schedule, records_dir, tmp_path / "kill-token",
        timeout=240, extra_launcher_args=["--elastic", "--max-np", "4", "--timeout", "120"],
    )
    report = describe(rc, out, err)
    assert rc == 0, report
    by_pid = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in records_dir.glob("*.jsonl")}
    everything = [r for lines in by_pid.values() for r in lines]
    report += "\n--- records ---\n" + "\n".join(json.dumps(r) for r in everything)

    # The first joiner died before its first collective; its replacement joined instead.
    killed = [r for r in everything if r["event"] == "killing myself"]
    assert len(killed) == 1 and killed[0]["joiner"], report
    starts = [r for r in everything if r["event"] == "start"]
    assert sorted((r["joiner"], r["rank"], r["size"]) for r in starts) == [
        (False, 0, 1), (True, 1, 2), (True, 2, 4), (True, 3, 4)], report  # a joiner is never rank 0

    # Every step ran on the cluster of the schedule, every rank once.
    steps = defaultdict(list)
    for r in everything:
        if r["event"] == "step":
            assert r["size"] == size_at(r["step"]), report
            steps[r["step"]].append(r["rank"])
    assert sorted(steps) == list(range(STEPS)), report
    for step, ranks in steps.items():
        assert sorted(ranks) == list(range(size_at(step))), (step, report)

    # Every resize returned changed=True at its step, on every member; the shrink detached the last rank.
    resizes = defaultdict(list)
    for r in everything:
        if r["event"] == "resize":
            resizes[r["step"]].append(r)
    assert sorted(resizes) == sorted(SCHEDULE), report
    for step, calls in resizes.items():
        assert len(calls) == size_at(step - 1), (step, report)
        assert all(c["changed"] and c["asked"] == SCHEDULE[step] for c in calls), (step, report)
        kept = [c for c in calls if not c["detached"]]
        assert all(not c["detached_call"] and c["size"] == SCHEDULE[step] for c in kept), (step, report)
        assert sorted(c["rank"] for c in kept) == list(range(len(kept))), (step, report)
    gone = [c for c in resizes[9] if c["detached"]]
    assert len(gone) == 1 and gone[0]["detached_call"], report
    gone_steps = [r for r in by_pid[str(gone[0]["pid"])] if r["event"] in ("step", "final")]
    assert [(r["step"], r["rank"]) for r in gone_steps] == [(6, 3), (7, 3), (8, 3)], report  # stopped by detached()

    # The finishers hold identical weights, equal to one process's run from rank 0's initial weights.
    finals = [r for r in everything if r["event"] == "final"]
    assert sorted(r["rank"] for r in finals) == [0, 1, 2], report
    assert all((r["step"], r["samples"]) == (STEPS, STEPS * BATCH) for r in finals), report
    assert len({tuple(r["weights"]) for r in finals}) == 1, report
    rank0 = next(r for r in starts if not r["joiner"])
    init = np.random.default_rng(int(rank0["pid"])).normal(size=DIM + 1)
    np.testing.assert_allclose(finals[0]["weights"], reference(init, STEPS), rtol=0, atol=1e-9, err_msg=report)


PLACE_SCRIPT = """
import json, kungfu_tf
print(json.dumps([kungfu_tf.rank(), kungfu_tf.size(), kungfu_tf.detached(), kungfu_tf.elastic.is_joiner()]))
"""


def test_a_joiner_warming_up_for_elastic_state_join_is_never_rank_0_before_its_admission():
    members = [f"127.0.0.1:{p}" for p in find_free_ports("127.0.0.1", 3)]
    joiner = members.pop()
    server = ConfigServer(
        secret="a" * 64, job_id="place", cluster=make_cluster(1, [parse_peer_string(p) for p in members]),
        elastic=True, min_size=1, max_size=4,
    ).start()
    try:
        client = ConfigClient(server.address, secret="a" * 64, job_id="place")
        client.set_signature("w (2,) float32")  # an ElasticState job: the joiner warms up alone
        env = worker_env(
            KUNGFU_CONFIG_SERVER=server.address, KUNGFU_ELASTIC="1", KUNGFU_JOB_SECRET="a" * 64,
            KUNGFU_JOB_ID="place", KUNGFU_SELF=joiner, KUNGFU_PEERS=joiner, KUNGFU_CLUSTER_VERSION="0",
            KUNGFU_JOINER="1",
        )
        done = subprocess.run([sys.executable, "-c", PLACE_SCRIPT], check=False, env=env, capture_output=True, text=True, timeout=120)
        client.close()
    finally:
        server.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2, 3, False, True], done.stdout + done.stderr


def test_the_plain_signature_and_a_model_signature_are_refused_with_the_reason():
    why = signature_difference(PLAIN_SIGNATURE, "dense/kernel (2, 2) float32")
    assert "plain processes" in why and "'dense/kernel (2, 2) float32'" in why and "same kind of script" in why
    why = signature_difference("dense/kernel (2, 2) float32", PLAIN_SIGNATURE)
    assert why.startswith("line 1: the joiner is made of plain processes")
    assert signature_difference(PLAIN_SIGNATURE, PLAIN_SIGNATURE) is None
