"""A worker of the host-loss experiment: the config service's client alone (no TensorFlow).

Rank 0 sets the model signature, prints "ready" and waits (the experiment
SIGKILLs its launcher; it dies with it). The others, and the replacement
once admitted, exit 0 when the cluster is whole again at version 3.
"""

import os
import sys
import time

from kungfu_tf.run.control.config_server import ConfigClient, cluster_peers
from kungfu_tf.run.worker_env.worker_env import read_worker_env

SIGNATURE = "w (2,) float32"

env = read_worker_env(os.environ)
client = ConfigClient(env.config_server, secret=env.secret, job_id=os.environ["KUNGFU_JOB_ID"])
deadline = time.monotonic() + 120


def wait_until(predicate):
    state = client.get_job_state()
    while not predicate(state):
        if time.monotonic() > deadline:
            sys.exit(3)
        state = client.wait_job_state(state.state_version, 1.0)
    return state


if env.joiner:
    client.joiner_ready(env.self_address, SIGNATURE)
    wait_until(lambda s: env.self_address in cluster_peers(s.cluster))
    sys.exit(0)
if env.rank == 0:
    client.set_signature(SIGNATURE)
    print("ready", flush=True)
    time.sleep(120)
    sys.exit(3)
wait_until(lambda s: s.cluster.version >= 3 and len(s.cluster.workers) == env.size)
