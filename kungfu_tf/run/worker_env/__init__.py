"""The worker-side environment: the ``KUNGFU_*`` variables through which a worker learns its job.

``kungfu-run`` writes them and a worker reads them (:mod:`.worker_env`); a
worker started by ``mpirun`` or ``srun`` derives them from its launcher's own
variables (:mod:`.external_launch`, Slurm host lists in :mod:`.slurm_hostlist`).
Both sides compute the same ranked peer list from ``host:slots`` entries
(:mod:`.placement`) and agree on the job's id and secret (:mod:`.job_id`,
:mod:`.job_secret`, :mod:`.host_shared_value`).

Imported by the op library's loader (``kungfu_tf._native``), so nothing here
imports gRPC, TensorFlow or the rest of the launcher; below it is only
:mod:`kungfu_tf.run.errors`.
"""
