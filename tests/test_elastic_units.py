"""Units of kungfu_tf.elastic that need no second worker: state bytes, signatures, values, argument checks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from kungfu_tf import elastic
from kungfu_tf.elastic import state_transfer as st
from kungfu_tf.elastic.signature import model_signature
from kungfu_tf.ops.elastic_membership import NotElasticError


def test_variables_round_trip_as_bytes_whatever_their_dtypes():
    values = [
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([True, False]),
        np.array(7, np.int64),
        np.array([1.5, -2.25], dtype=tf.bfloat16.as_numpy_dtype),
    ]
    source = [tf.Variable(v) for v in values]
    target = [tf.Variable(np.zeros_like(v)) for v in values]
    data = st.variable_bytes(source)
    assert len(data) == 24 + 2 + 8 + 4
    pieces = [data[a:b] for a, b in st.slice_bounds(len(data), 3)]  # sent by 3 sources, joined again
    st.assign_from_bytes(target, b"".join(pieces))
    for got, want in zip(target, values):
        np.testing.assert_array_equal(got.numpy().astype(np.float64), want.astype(np.float64))
        assert got.dtype == tf.as_dtype(want.dtype)


def test_a_wrong_number_of_bytes_is_refused_before_any_variable_changes():
    v = tf.Variable([1.0, 2.0])
    with pytest.raises(ValueError, match="received 4 bytes of variables, this model has 8"):
        st.assign_from_bytes([v], b"\0" * 4)
    np.testing.assert_array_equal(v.numpy(), [1.0, 2.0])


@pytest.mark.parametrize(("total", "parts"), [(0, 1), (1, 3), (10, 3), (1000, 7)])
def test_slices_cover_the_bytes_once_in_order(total, parts):
    bounds = st.slice_bounds(total, parts)
    assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


def test_digest_covers_variables_and_python_state():
    d = st.digest(b"ab", b'{"step":1}')
    assert d != st.digest(b"ab", b'{"step":2}') and d != st.digest(b"ac", b'{"step":1}')
    assert d != st.digest(b"a", b'b{"step":1}')  # the boundary between the parts counts


def test_signature_names_shape_and_dtype_of_every_variable_in_order():
    sig = model_signature([tf.Variable(tf.zeros([2, 3]), name="kernel"), tf.Variable(0, dtype=tf.int64, name="it")])
    assert sig.splitlines() == ["kernel:0 (2, 3) float32", "it:0 () int64"]
    with pytest.raises(TypeError, match=r"variables\[0\] 's:0' has dtype string"):
        model_signature([tf.Variable("x", name="s")])


def test_python_state_holds_values_and_objects_with_state_dict():
    class Sampler:
        def __init__(self):
            self.offset = 0

        def state_dict(self):
            return {"offset": self.offset}

        def load_state_dict(self, d):
            self.offset = d["offset"]

    sampler = Sampler()
    state = elastic.ElasticState([tf.Variable(1.0)], sampler=sampler, lr=0.1)
    state.commit()
    state.epoch += 1
    sampler.offset = 12
    assert state.python_state() == {"step": 1, "epoch": 1, "sampler": {"offset": 12}, "lr": 0.1}
    other = elastic.ElasticState([tf.Variable(1.0)], sampler=Sampler(), lr=0.5)
    other.load_python_state(state.python_state())
    assert (other.step, other.epoch, other.sampler.offset, other.lr) == (1, 1, 12, 0.1)
    with pytest.raises(AttributeError, match="no value 'missing'"):
        _ = state.missing
    with pytest.raises(ValueError, match="'commit' cannot be the name of a value"):
        elastic.ElasticState([], commit=1)
    with pytest.raises(ValueError, match="check_every must be an int >= 1, got 0"):
        elastic.ElasticState([], check_every=0)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "message"),
    [
        ((0,), {}, ValueError, "new_size must be >= 1, got 0"),
        ((-3,), {}, ValueError, "new_size must be >= 1, got -3"),
        ((2.5,), {}, TypeError, "new_size must be an int >= 1, got float 2.5"),
        ((True,), {}, TypeError, "got the bool True"),
        ((2,), {"workers": ["h:1"]}, ValueError, "pass new_size .* or workers .*, not both"),
        ((), {"workers": ["h:1", "h:2", "h:1"]}, ValueError, r"workers\[2\] 'h:1' appears more than once"),
        ((), {"workers": []}, ValueError, "at least one worker"),
        ((), {"workers": "h:1"}, TypeError, "workers must be a list"),
        ((), {"workers": [("h", 1)]}, TypeError, r"workers\[0\] must be a 'host:port' string"),
        ((2,), {"wait": 1}, TypeError, "wait must be a bool"),
    ],
)
def test_resize_refuses_bad_arguments_before_anything_happens(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        elastic.resize(*args, **kwargs)


def test_resize_outside_an_elastic_job_says_how_to_start_one(monkeypatch):
    monkeypatch.delenv("KUNGFU_CONFIG_SERVER", raising=False)
    with pytest.raises(NotElasticError, match="kungfu-run --elastic"):
        elastic.resize(1)
