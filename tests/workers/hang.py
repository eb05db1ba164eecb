"""Worker for test_failures.py::test_hung_job_is_killed: never finishes.

Usage: hang.py PIDFILE

Starts a grandchild in a session of its own (out of reach of the
launcher's process-group signals) that ignores SIGTERM; writes both pids to
PIDFILE. No TensorFlow: this tests the harness's teardown.
"""

import os
import pathlib
import subprocess
import sys
import time

child = subprocess.Popen(
    [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
    start_new_session=True,
    stdout=subprocess.DEVNULL,  # else the launcher waits for the pipes to close
    stderr=subprocess.DEVNULL,
)
path = pathlib.Path(sys.argv[1])
tmp = path.with_suffix(".tmp")
tmp.write_text(f"{os.getpid()} {child.pid}")
tmp.rename(path)
print("hanging", flush=True)
time.sleep(600)
