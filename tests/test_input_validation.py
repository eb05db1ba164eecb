"""Every kernel validates its inputs: InvalidArgumentError naming the input, and the worker lives on.

* Non-scalar rank/version/min_version/num_rows of the p2p and rows ops
  (tests/workers/bad_scalar_inputs.py), eagerly and in a tf.function, in a
  subprocess: TensorFlow's scalar accessor used to abort the whole worker,
  which only a separate process can observe (the last "case" line it printed
  names the case that aborted).
* Message keys and p2p names: ValueError in Python; a raw key tensor that
  bypasses Python gets InvalidArgumentError from the kernel (here at np=1,
  and at np=2 in tests/workers/rejected_inputs.py, where the next
  all_reduce must still be right).
* Tensors of more than 8 dimensions: rejected by the collectives before
  anything is sent (the frame header holds 8), at np=1 as at np=2.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_job_ok, describe, run_job, worker_env, worker_path

from kungfu_tf import ops
from kungfu_tf._native import library
from kungfu_tf.ops import p2p

SCALAR_CASES = (
    "request_rank",
    "request_version",
    "request_at_least_rank",
    "request_at_least_min_version",
    "save_version",
    "push_rank",
    "push_rows_rank",
    "push_rows_num_rows",
    "save_rows_version",
    "request_rows_rank",
    "request_rows_min_version",
)


def test_non_scalar_inputs_are_errors_not_aborts():
    # One process for all cases (a TensorFlow start costs seconds here); an
    # abort ends it with a negative status after the line of its case.
    proc = subprocess.run(
        [sys.executable, worker_path("bad_scalar_inputs.py"), *SCALAR_CASES],
        env=worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    details = describe(proc.returncode, proc.stdout, proc.stderr)
    assert proc.returncode == 0, details
    lines = proc.stdout.strip().splitlines()
    assert [line for line in lines if line.startswith("case ")] == [f"case {c}" for c in SCALAR_CASES], details
    assert lines[-1] == f"checked {4 * len(SCALAR_CASES)} results", details


def _invalid(fn, needle: str) -> None:
    """``fn()`` raises InvalidArgumentError containing ``needle``, eagerly and in a tf.function."""

    def traced():
        out = fn()
        # Stateless collectives run only if their output is used; stateful ops
        # without outputs run through automatic control dependencies.
        return None if isinstance(out, tf.Operation) else out

    for run in (fn, tf.function(traced, autograph=False)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=needle):
            run()


X = tf.constant([1.0, 2.0])


def _still_works() -> None:
    np.testing.assert_array_equal(ops.all_reduce(X).numpy(), X.numpy())


@pytest.mark.parametrize(
    "name, needle",
    [
        ("k" * 1025, "is 1025 bytes in UTF-8; names may be at most 1024 bytes"),
        ("\u00e9" * 513, "is 1026 bytes in UTF-8"),  # 513 characters, 1026 bytes
        ("grads\x01barrier", r"contains '\\x01' \(reserved for internal sub-keys\) at offset 5"),
        ("a\x00b", r"contains '\\x00' at offset 1"),
        ("", "must be a non-empty string"),
    ],
)
def test_python_rejects_bad_names(name, needle):
    for call in (
        lambda: ops.all_reduce(X, name=name),
        lambda: ops.barrier(name=name),
        lambda: ops.consensus(X, name=name),
        lambda: p2p.save(name, X),
        lambda: p2p.request(0, name, like=X),
        lambda: p2p.push(0, name, X),
        lambda: p2p.take(name, like=X),
    ):
        with pytest.raises(ValueError, match=needle):
            call()
    _still_works()


def test_longest_name_is_accepted():
    name = "n" * 1024
    np.testing.assert_array_equal(ops.all_reduce(X, name=name).numpy(), X.numpy())
    p2p.save(name, X)
    np.testing.assert_array_equal(p2p.request(0, name, like=X).numpy(), X.numpy())


def test_kernels_reject_bad_raw_keys():
    lib = library()
    long_key, sub_key = tf.constant("k" * 1025), tf.constant("w\x01switched")
    cases = [
        (lambda: lib.kungfu_all_reduce(X, long_key), "KungfuAllReduce: input 'key': name 'kkk.*is 1025 bytes"),
        (lambda: lib.kungfu_all_reduce(X, sub_key), r"KungfuAllReduce: input 'key': name 'w\\x01switched' contains"),
        (lambda: lib.kungfu_group_all_reduce([X], sub_key), "KungfuGroupAllReduce: input 'key'"),
        (lambda: lib.kungfu_broadcast(X, sub_key), "KungfuBroadcast: input 'key'"),
        (lambda: lib.kungfu_reduce(X, sub_key), "KungfuReduce: input 'key'"),
        (lambda: lib.kungfu_all_gather(X, sub_key), "KungfuAllGather: input 'key'"),
        (lambda: lib.kungfu_barrier(sub_key), "KungfuBarrier: input 'key'"),
        (lambda: lib.kungfu_consensus(X, sub_key), "KungfuConsensus: input 'key'"),
        (lambda: lib.kungfu_set_topology("RING", sub_key), "KungfuSetTopology: input 'key'"),
        (lambda: lib.kungfu_save(sub_key, X, tf.constant(-1, tf.int64)), "KungfuSave: input 'blob_name'"),
        (lambda: lib.kungfu_push(0, long_key, X), "KungfuPush: input 'blob_name'.*1025 bytes"),
        (lambda: lib.kungfu_take(sub_key, X), "KungfuTake: input 'blob_name'"),
        (lambda: lib.kungfu_take_rows(sub_key, T=tf.float32, shape=[2, 1]), "KungfuTakeRows: input 'blob_name'"),
        (lambda: lib.kungfu_all_reduce(X, tf.constant(["k"])), "KungfuAllReduce: input 'key' must be a scalar string"),
        (
            lambda: lib.kungfu_all_reduce(X, lib.kungfu_collective_key(key_name="w\x01barrier")),
            "KungfuCollectiveKey: attr 'key_name'",
        ),
    ]
    for call, needle in cases:
        _invalid(call, needle)
    _still_works()


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce", "all_gather"])
def test_collectives_reject_more_than_8_dims(collective):
    x = tf.ones([1] * 8 + [2])
    fn = getattr(ops, collective)
    needle = f"kungfu collectives support at most 8 dimensions, got 9 for Kungfu.* 'nine/{collective}"
    # A fresh name per run: a graph allows each explicit name once.
    names = iter(["", "/traced"])
    _invalid(lambda: fn(x, name=f"nine/{collective}{next(names)}"), needle)
    _still_works()


def test_eight_dims_and_fused_nine_dims_work():
    eight = tf.reshape(tf.range(6.0), [1] * 6 + [2, 3])
    np.testing.assert_array_equal(ops.all_reduce(eight).numpy(), eight.numpy())
    nine = tf.reshape(tf.range(6.0), [1] * 7 + [1, 2, 3])
    # group_all_reduce sends one fused 1-D buffer: any rank travels.
    np.testing.assert_array_equal(ops.group_all_reduce([nine])[0].numpy(), nine.numpy())


def test_integer_mean_is_rejected_by_the_kernels():
    # ops.all_reduce refuses it in Python; the kernels used to return the sum.
    lib, ints, key = library(), tf.constant([1, 2]), tf.constant("int_mean")
    needle = "attr 'op': 'mean' needs a floating-point dtype, got int32"
    _invalid(lambda: lib.kungfu_all_reduce(ints, key, op="mean"), "KungfuAllReduce: " + needle)
    _invalid(lambda: lib.kungfu_group_all_reduce([ints], key, op="mean"), "KungfuGroupAllReduce: " + needle)
    _invalid(lambda: lib.kungfu_reduce(ints, key, op="mean"), "KungfuReduce: " + needle)
    _still_works()


def test_rows_inputs_are_checked():
    _invalid(
        lambda: p2p.save_rows("t", tf.zeros([4, 2]), tf.zeros([1, 1], tf.int32), 1),
        r"KungfuSaveRows: input 'rows' must be a vector of row indices, got shape \[1,1\]",
    )
    needle = r"attr 'shape': a table needs at least one dimension \(rows\), got shape \[\]"
    with pytest.raises(tf.errors.InvalidArgumentError, match=needle):
        library().kungfu_take_rows("t", T=tf.float32, shape=[])
    # Traced, the shape function finds it first: an error when the graph is built.
    with pytest.raises(ValueError, match=needle):
        tf.function(lambda: library().kungfu_take_rows("t", T=tf.float32, shape=[]), autograph=False)()


def test_rejected_inputs_leave_workers_working():
    rc, out, err = run_job(2, "rejected_inputs.py", timeout=180, extra_launcher_args=["--timeout", "30"])
    assert_job_ok(rc, out, err, 2, expected_checks=12)
