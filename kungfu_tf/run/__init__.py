"""``kungfu-run``: the launcher that starts one process per KungFu worker.

The launcher only computes the peer list, starts the workers with the
``KUNGFU_*`` environment the runtime reads, relays their output and tears
the job down when a worker fails.  It deliberately never imports
TensorFlow so that it starts instantly.

Entry points: ``python -m kungfu_tf.run`` and the ``kungfu-run`` console
script, both of which call :func:`kungfu_tf.run.launch.launcher.main`.

Workers on a Ray cluster: ``kungfu-run --ray ADDRESS`` or, from Python,
:func:`ray_launch` (kungfu_tf/run/launch/ray_job.py; needs ``pip install kungfu_tf[ray]``).
"""

from kungfu_tf.run.launch.ray_job import ray_launch

__all__ = ["ray_launch"]
