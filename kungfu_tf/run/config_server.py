"""Deprecated path: this module moved to :mod:`kungfu_tf.run.control.config_server`.

``import kungfu_tf.run.config_server`` still works and gives that module itself (so a
monkeypatch through either name reaches the same functions), with a
DeprecationWarning; the old path will be removed.
"""

import sys
import warnings

from kungfu_tf.run.control import config_server as _moved

warnings.warn(
    "kungfu_tf.run.config_server moved to kungfu_tf.run.control.config_server; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
