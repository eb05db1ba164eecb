"""``kungfu-run`` itself: the entry point and the supervisors that run a job to its end.

:func:`.launcher.main` parses the command line and picks a supervisor:
:class:`~.supervisor.JobSupervisor` (a fixed set of workers) or
:class:`~.elastic_supervisor.ElasticSupervisor` (the config service, joiners
and losses, over a worker provider); :mod:`.ray_job` is the ``--ray`` front
end and :func:`~.ray_job.ray_launch`. :mod:`.grpc_fork_safety` keeps gRPC's
fork handlers out of the launcher's forks.
"""
