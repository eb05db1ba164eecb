"""Deprecated path: this module moved to :mod:`kungfu_tf.run.control.job_state`.

``import kungfu_tf.run.job_state`` still works and gives that module itself (so a
monkeypatch through either name reaches the same functions), with a
DeprecationWarning; the old path will be removed.
"""

import sys
import warnings

from kungfu_tf.run.control import job_state as _moved

warnings.warn(
    "kungfu_tf.run.job_state moved to kungfu_tf.run.control.job_state; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _moved
