"""What a strategy needs to know about a variable: name, shape, dtype, sparse or not.

Builders, validation and ``kungfu-strategy explain`` work from these
descriptions rather than from live variables, so that a strategy can be built
and checked without creating the model's variables on a worker.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.strategy.variable_info import VariableInfo
    >>> VariableInfo.from_variable(tf.Variable(tf.zeros([3, 2]), name="w"))
    VariableInfo(name='w', shape=(3, 2), dtype='float32', sparse=False)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class VariableInfo:
    """A trainable variable as a strategy sees it.

    ``name`` is the name strategy nodes refer to (:func:`variable_name`);
    ``sparse`` says the variable's gradient is a ``tf.IndexedSlices``
    (embedding tables), which builders such as Parallax treat differently.

    Example:
        >>> VariableInfo("emb", (1000, 16), "float32", sparse=True).nbytes
        64000
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    sparse: bool = False

    @property
    def nbytes(self) -> int:
        """Size of the variable (and of a dense gradient) in bytes."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @classmethod
    def from_variable(cls, variable: Any, sparse: bool = False) -> VariableInfo:
        """Describes a Keras 3 or TF variable.

        Example:
            >>> import keras
            >>> VariableInfo.from_variable(keras.Variable([1.0, 2.0], name="b")).shape
            (2,)
        """
        shape = tuple(int(d) for d in variable.shape)
        dtype = variable.dtype if isinstance(variable.dtype, str) else variable.dtype.name
        return cls(variable_name(variable), shape, str(dtype), sparse)


def variable_name(variable: Any) -> str:
    """The name strategies use for ``variable``: Keras 3 ``path``, else the TF name without ":0".

    Example:
        >>> import tensorflow as tf
        >>> variable_name(tf.Variable(1.0, name="scale"))
        'scale'
    """
    path = getattr(variable, "path", None)
    if isinstance(path, str) and path:
        return path
    name = variable.name
    return name.removesuffix(":0")


def is_embedding_table(variable: Any) -> bool:
    """True for a Keras ``Embedding`` layer's table (variable name ``.../embeddings``).

    Its gradient is a ``tf.IndexedSlices``. The optimizer sees variables, not
    layers, so the name is the one rule every part of the strategy layer uses
    (the optimizer, ``kungfu-strategy build``): a strategy built from a model
    offline must be the one the optimizer builds for it at run time.

    Example:
        >>> import keras
        >>> layer = keras.layers.Embedding(10, 2); layer.build((None,))
        >>> is_embedding_table(layer.embeddings)
        True
    """
    return variable_name(variable).rsplit("/", 1)[-1] == "embeddings"


def describe_variables(variables: Iterable[Any], sparse_names: Iterable[str] = ()) -> list[VariableInfo]:
    """VariableInfo for live variables; embedding tables and ``sparse_names`` are marked sparse.

    Example:
        >>> import tensorflow as tf
        >>> [v.sparse for v in describe_variables([tf.Variable([1.0], name="w")], sparse_names=["w"])]
        [True]
    """
    names = set(sparse_names)
    return [
        VariableInfo.from_variable(v, sparse=is_embedding_table(v) or variable_name(v) in names) for v in variables
    ]


def describe_model(model: Any, sparse_names: Iterable[str] = ()) -> list[VariableInfo]:
    """Every trainable variable of a Keras model, as :func:`describe_variables` describes it.

    Example:
        >>> import keras
        >>> m = keras.Sequential([keras.Input((4,), dtype="int32"), keras.layers.Embedding(10, 3)])
        >>> [(v.shape, v.sparse) for v in describe_model(m)]
        [((10, 3), True)]
    """
    return describe_variables(model.trainable_variables, sparse_names)


def check_unique_names(variables: Sequence[VariableInfo]) -> None:
    """``ValueError`` if two variables share a name (a strategy could not tell them apart).

    Example:
        >>> check_unique_names([VariableInfo("w", (1,)), VariableInfo("w", (2,))])
        Traceback (most recent call last):
        ...
        ValueError: two trainable variables are both named 'w'; give the layers distinct names
    """
    seen: set[str] = set()
    for v in variables:
        if v.name in seen:
            raise ValueError(f"two trainable variables are both named {v.name!r}; give the layers distinct names")
        seen.add(v.name)
