"""Elastic state sync in C++ (kungfu_tf.ops.state_sync): variables move between runtimes and are hashed there.

* One process: every dtype round-trips through the pieces from several
  "sources" (all this worker), the digest equals the layout's SHA-256
  computed independently with numpy + hashlib (the same on the sender, the
  receiver and a worker that only hashes), strings are refused by name, and
  forget_state drops the pieces.
* Three workers (tests/workers/state_sync.py): a receiver fetches a 10 MiB
  state from two sources at once; a fetch that cannot complete (a source
  that never saves: DeadlineExceeded after the 8 s timeout) or that meets
  pieces of another size leaves every variable as it was.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_job_ok, describe, rank_lines, run_job

from kungfu_tf.ops import p2p, state_sync

sys.path.insert(0, str(Path(__file__).parent / "workers"))
from state_digest_reference import PIECE, reference_digest


def test_every_dtype_round_trips_from_several_sources_and_the_digest_is_the_layouts_xxh3_128():
    rng = np.random.default_rng(3)
    values = [
        rng.normal(size=(1200, 1000)).astype(np.float32),  # crosses the first piece boundary
        np.array([True, False, True]),
        np.arange(7, dtype=np.int8),
        rng.integers(0, 255, size=5, dtype=np.uint8),
        np.arange(3, dtype=np.int16),
        np.array(9, np.int32),
        np.array([2**40, -5], np.int64),
        rng.normal(size=11).astype(np.float16),
        rng.normal(size=700_000).astype(tf.bfloat16.as_numpy_dtype),
        rng.normal(size=5).astype(np.float64),
        np.zeros([0, 4], np.float32),  # empty: in no piece
        (rng.normal(size=4) + 1j).astype(np.complex64),
    ]
    sources = [tf.Variable(v) for v in values]
    targets = [tf.Variable(np.zeros_like(v)) for v in values]
    want = reference_digest(values)
    for j in range(3):
        assert bytes(state_sync.save_state(sources, "units/state", version=4, source=j, sources=3).numpy()) == want
    got = state_sync.fetch_state(targets, [0, 0, 0], "units/state", min_version=4)
    assert bytes(got.numpy()) == want
    for t, v in zip(targets, values):
        assert t.dtype == tf.as_dtype(v.dtype)
        np.testing.assert_array_equal(np.asarray(t.numpy()).astype(np.complex128), v.astype(np.complex128))
    assert bytes(state_sync.state_digest(targets).numpy()) == want
    targets[0].assign_add(tf.ones_like(targets[0]))  # the received buffer is the variable's own: it updates
    assert bytes(state_sync.state_digest(targets).numpy()) != want
    state_sync.forget_state("units/state")
    with pytest.raises(tf.errors.NotFoundError):
        p2p.request(0, "units/state/0", like=tf.zeros([PIECE], tf.uint8), version=4)


def test_an_empty_state_has_the_digest_of_nothing():
    assert bytes(state_sync.state_digest([]).numpy()) == reference_digest([])


def test_keras_variables_travel_too():
    import keras

    source, target = keras.Variable(np.arange(6.0).reshape(2, 3)), keras.Variable(np.zeros((2, 3)))
    state_sync.save_state([source], "units/keras", version=1, source=0, sources=1)
    state_sync.fetch_state([target], [0], "units/keras", min_version=1)
    np.testing.assert_array_equal(np.asarray(target.numpy()), np.arange(6.0).reshape(2, 3))


def test_strings_and_non_variables_are_refused_by_name():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"variables\[1\] has dtype string"):
        state_sync.state_digest([tf.Variable(1.0), tf.Variable("text")])
    with pytest.raises(TypeError, match=r"variables\[0\] \(EagerTensor\) is not a resource variable"):
        state_sync.state_digest([tf.constant(1.0)])
    with pytest.raises(tf.errors.InvalidArgumentError, match="source must be in"):
        state_sync.save_state([tf.Variable(1.0)], "units/bad", version=1, source=2, sources=2)


def test_a_receiver_fetches_from_two_sources_and_an_incomplete_fetch_changes_nothing(tmp_path):
    rc, out, err = run_job(3, "state_sync.py", tmp_path, timeout=180, extra_launcher_args=["--timeout", "8"])
    counts = assert_job_ok(rc, out, err, 3)
    assert counts == {0: 2 + 5, 1: 2 + 5, 2: 2 + 5 + 1 + 5 + 1 + 1}, describe(rc, out, err)
    lines = rank_lines(out)[2]
    assert any(line.startswith("incomplete: ") for line in lines), describe(rc, out, err)
    assert any(line.startswith("size: ") for line in lines), describe(rc, out, err)
