"""Commits steps of an ElasticState (no collectives) until the file named by argv[1] exists.

Used by tests/test_job_status.py: rank 0's ElasticState.commit reports its
step to the config service, which kungfu-run's status line shows.
"""

import os
import sys
import time

from kungfu_tf import elastic

stop_file = sys.argv[1]
state = elastic.ElasticState()
while not os.path.exists(stop_file):
    time.sleep(0.02)
    state.commit()
print(f"stopped at step {state.step}", flush=True)
