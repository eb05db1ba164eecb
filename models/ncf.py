"""Neural Collaborative Filtering (He et al. 2017): GMF + MLP towers -> sigmoid.

Users and items each get two embedding tables: one for the generalized matrix
factorization (GMF) tower (element-wise product) and one for the MLP tower
(concatenation then dense layers). The towers are concatenated and a dense
layer predicts the interaction probability. The defaults use MovieLens-20M's
table sizes, so most parameters live in large embedding tables whose gradients
are sparse ``tf.IndexedSlices``.

Example:
    >>> model = build_ncf(num_users=10, num_items=20, gmf_dim=4, mlp_dims=(8, 4))
    >>> model.output_shape
    (None, 1)
    >>> users, items, labels = synthetic_interactions(num_users=10, num_items=20, n=5, seed=0)
    >>> users.shape, items.shape, labels.shape
    ((5,), (5,), (5,))
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import numpy as np

MOVIELENS_20M_USERS = 138_493
MOVIELENS_20M_ITEMS = 26_744


def build_ncf(
    num_users: int = MOVIELENS_20M_USERS,
    num_items: int = MOVIELENS_20M_ITEMS,
    gmf_dim: int = 64,
    mlp_dims: Sequence[int] = (256, 128, 64),
) -> keras.Model:
    """An uncompiled NeuMF model: inputs [user_ids, item_ids] (int32 [batch]) -> probability [batch, 1].

    The MLP tower's user and item embeddings are each mlp_dims[0] // 2 wide so
    that their concatenation feeds the first dense layer of width mlp_dims[0].

    Example:
        >>> m = build_ncf(num_users=100, num_items=50, gmf_dim=8, mlp_dims=(16, 8))
        >>> [tuple(t.shape) for t in m.inputs]
        [(None,), (None,)]
    """
    if not mlp_dims or mlp_dims[0] % 2:
        raise ValueError(f"mlp_dims must be non-empty with an even first width, got {mlp_dims}")
    users = keras.Input(shape=(), dtype="int32", name="user")
    items = keras.Input(shape=(), dtype="int32", name="item")
    init = keras.initializers.RandomNormal(stddev=0.01)  # as in the NCF paper

    def embed(ids: keras.KerasTensor, rows: int, dim: int, name: str) -> keras.KerasTensor:
        return keras.layers.Embedding(rows, dim, embeddings_initializer=init, name=name)(ids)

    gmf = keras.layers.Multiply()([embed(users, num_users, gmf_dim, "gmf_user"), embed(items, num_items, gmf_dim, "gmf_item")])
    half = mlp_dims[0] // 2
    mlp = keras.layers.Concatenate()([embed(users, num_users, half, "mlp_user"), embed(items, num_items, half, "mlp_item")])
    for width in mlp_dims[1:]:
        mlp = keras.layers.Dense(width, activation="relu")(mlp)
    joint = keras.layers.Concatenate()([gmf, mlp])
    prob = keras.layers.Dense(1, activation="sigmoid", name="prediction")(joint)
    return keras.Model([users, items], prob, name="ncf")


def synthetic_interactions(
    num_users: int, num_items: int, n: int, seed: int = 0, factors: int = 8
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Learnable implicit feedback: int32 user ids [n], int32 item ids [n], float32 0/1 labels [n].

    Hidden user and item factor vectors are drawn at random; a pair is a
    positive interaction when their dot product is positive, so a model that
    learns embeddings resembling the factors can predict the labels.

    Example:
        >>> u, i, y = synthetic_interactions(num_users=4, num_items=6, n=100, seed=0)
        >>> int(u.max()) < 4, int(i.max()) < 6, set(y.tolist()) <= {0.0, 1.0}
        (True, True, True)
    """
    rng = np.random.default_rng(seed)
    user_factors = rng.standard_normal((num_users, factors)).astype(np.float32)
    item_factors = rng.standard_normal((num_items, factors)).astype(np.float32)
    users = rng.integers(0, num_users, size=n).astype(np.int32)
    items = rng.integers(0, num_items, size=n).astype(np.int32)
    scores = (user_factors[users] * item_factors[items]).sum(axis=1)
    return users, items, (scores > 0).astype(np.float32)
