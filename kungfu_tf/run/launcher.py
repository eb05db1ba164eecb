"""Deprecated path: this module moved to :mod:`kungfu_tf.run.launch.launcher`.

``import kungfu_tf.run.launcher`` still works and gives that module itself (so a
monkeypatch through either name reaches the same functions), with a
DeprecationWarning; the old path will be removed.
"""

import sys
import warnings

from kungfu_tf.run.launch import launcher as _moved

warnings.warn(
    "kungfu_tf.run.launcher moved to kungfu_tf.run.launch.launcher; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
