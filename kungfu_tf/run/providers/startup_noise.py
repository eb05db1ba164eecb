"""TensorFlow's start-up lines, which ``kungfu-run`` keeps off the terminal by default.

Every TensorFlow process prints the same few lines as it starts (absl's
pre-initialisation warning, the oneDNN notice, the CPU-instruction notice),
whatever ``TF_CPP_MIN_LOG_LEVEL`` says for the first of them. With N workers
that is N copies before the first useful line. The launcher drops exactly
these lines from the terminal (the ``--logdir`` files keep everything);
``--tf-startup-logs``, or a ``TF_CPP_MIN_LOG_LEVEL`` the user set, shows them.

Example:
    >>> is_tf_startup_noise(b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
    True
    >>> is_tf_startup_noise(b"I0000 00:00:1795684343.536944   30454 port.cc:153] oneDNN custom operations are on.\\n")
    True
    >>> is_tf_startup_noise(b"epoch 1: loss 0.31\\n")
    False
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_NOISE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|[IW]\d{4} [\d:.]+ +\d+ (port\.cc|cpu_feature_guard\.cc):\d+\] "
    rb"|To enable the following instructions: .* in other operations, rebuild TensorFlow"
    rb")"
)


def is_tf_startup_noise(line: bytes) -> bool:
    """Whether ``line`` is one of TensorFlow's start-up notices."""
    return _NOISE.match(line) is not None


def hide_tf_startup(show_flag: bool, environ: Mapping[str, str]) -> bool:
    """Hide the notices unless ``--tf-startup-logs`` was given or the user set ``TF_CPP_MIN_LOG_LEVEL``.

    Example:
        >>> hide_tf_startup(False, {}), hide_tf_startup(True, {}), hide_tf_startup(False, {"TF_CPP_MIN_LOG_LEVEL": "0"})
        (True, False, False)
    """
    return not show_flag and "TF_CPP_MIN_LOG_LEVEL" not in environ
