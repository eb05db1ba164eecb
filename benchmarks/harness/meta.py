"""Where and how benchmark numbers were taken: the part every report shares.

Example:
    >>> meta = machine_metadata()
    >>> sorted(meta)[:3]
    ['argv', 'cpu_count', 'date']
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sys
from typing import Any


def machine_metadata() -> dict[str, Any]:
    """Date, command, machine, Python/TF versions and the load at the start."""
    try:
        tf_version = importlib.metadata.version("tensorflow-cpu")
    except importlib.metadata.PackageNotFoundError:
        tf_version = "unknown"
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv,
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf_version,
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
