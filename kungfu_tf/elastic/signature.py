"""``model_signature``: what a joiner's model must match before it may join.

One line ``"name shape dtype"`` per variable, in order. The config service
admits a joiner only if its signature equals the members' (the first
differing line names the variable that differs), so a joiner built from
another model is refused before it can receive or send any state.

Example:
    >>> import tensorflow as tf
    >>> from kungfu_tf.elastic.signature import model_signature
    >>> print(model_signature([tf.Variable(tf.zeros([2, 3]), name="w"), tf.Variable(0, name="step")]))
    w:0 (2, 3) float32
    step:0 () int32
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def variable_name(variable: object) -> str:
    """A variable's name as the signature shows it (Keras 3's ``path``, else ``name``)."""
    name = getattr(variable, "path", None) or getattr(variable, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"model_signature: {variable!r} has no name; pass tf.Variable or keras.Variable objects")
    return name


def variable_dtype(variable: object) -> tf.DType:
    """A variable's dtype as a tf.DType (Keras 3 variables give a string)."""
    return tf.as_dtype(variable.dtype)  # type: ignore[attr-defined]


def model_signature(variables: Sequence[object]) -> str:
    """One line "name shape dtype" per variable of ``variables``, in order.

    Raises:
        TypeError: a variable without a name, or of a dtype that cannot be
            transferred as bytes (string, resource, variant).

    Example:
        >>> import tensorflow as tf
        >>> model_signature([tf.Variable([1.0, 2.0], name="b")])
        'b:0 (2,) float32'
    """
    lines = []
    for i, v in enumerate(variables):
        dtype = variable_dtype(v)
        if dtype in (tf.string, tf.resource, tf.variant):
            raise TypeError(
                f"model_signature: variables[{i}] {variable_name(v)!r} has dtype {dtype.name}, "
                "which elastic state transfer cannot send (numbers and bools only)"
            )
        shape = tuple(int(d) for d in tf.TensorShape(v.shape).as_list())
        lines.append(f"{variable_name(v)} {shape} {dtype.name}")
    return "\n".join(lines)
