"""Which slot belongs to which variable, for optimizers whose slots are not one per kind of the variable's shape
(kungfu_tf/optimizers/strategy_replan.py ``slot_table``; one process, no collective).

Keras's Adafactor makes a matrix's factored moments with ``add_variable`` (no reference variable) and a
bias's placeholder scalars as bare variables, all held in lists by variable index; Muon makes one slot for a
matrix and two for a bias. Both were refused with parameter servers in an elastic job ("slot ... was not
made for a variable this rank updates" / "different numbers of slots"). A shard's factored slots still are:
they are not a cut of the variable's.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from kungfu_tf.optimizers.strategy_replan import slot_table
from kungfu_tf.strategy.errors import StrategyError


def built(opt: keras.optimizers.Optimizer, variables: list[keras.Variable]) -> tuple[keras.optimizers.Optimizer, set]:
    opt.build(variables)
    return opt, {id(opt.iterations), id(opt._learning_rate)}


def two_variables() -> list[keras.Variable]:
    return [keras.Variable(np.ones((4, 3), np.float32), name="kernel"),
            keras.Variable(np.ones(3, np.float32), name="bias")]  # fmt: skip


def shapes(table: list[list]) -> list[list]:
    return [[None if s is None else (tuple(s.shape), str(s.dtype)) for s in row] for row in table]


def test_adafactors_factored_slots_belong_to_their_variables():
    variables = two_variables()
    opt, fixed = built(keras.optimizers.Adafactor(0.1), variables)
    table = slot_table(opt, fixed, variables)
    assert shapes(table) == [[((4,), "float32"), ((), "int32")], [((3,), "float32"), ((), "int32")],
                             [((4, 3), "float32"), ((3,), "float32")]]  # fmt: skip
    assert table[0][0] is opt._r[0] and table[1][1] is opt._c[1] and table[2][0] is opt._v[0]


def test_muons_matrix_has_one_slot_kind_fewer():
    variables = two_variables()
    opt, fixed = built(keras.optimizers.Muon(0.1), variables)
    table = slot_table(opt, fixed, variables)
    assert shapes(table) == [[((4, 3), "float32"), ((3,), "float32")], [None, ((3,), "float32")]]


def test_a_shards_factored_slots_are_refused():
    whole = keras.Variable(np.ones((8, 3), np.float32), name="whole")
    shard = keras.Variable(np.ones((4, 3), np.float32), name="shard")
    opt, fixed = built(keras.optimizers.Adafactor(0.1), [shard])
    opt.__dict__["_kungfu_model_variables"] = [whole]  # the shard is a target, not a model variable
    with pytest.raises(StrategyError, match="a partitioned variable's slots are cut from its own"):
        slot_table(opt, fixed, [shard])
    opt, fixed = built(keras.optimizers.Adam(0.1), [shard])
    opt.__dict__["_kungfu_model_variables"] = [whole]
    assert shapes(slot_table(opt, fixed, [shard])) == [[((4, 3), "float32")], [((4, 3), "float32")]]
