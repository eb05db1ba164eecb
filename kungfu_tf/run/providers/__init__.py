"""Where workers run: starting them, relaying their output, placing joiners.

:mod:`.worker_provider` is the seam (the ``WorkerProvider``, ``WorkerHandle``
and ``JoinerPlanner`` Protocols) with :class:`~.worker_provider.LocalProcesses`
behind it: child processes (:mod:`.worker_process`, dying with the launcher
through :mod:`.parent_death`) whose output :mod:`.output` relays (dropping
:mod:`.startup_noise`), and joiners scheduled by :mod:`.joiner_scheduler` on
the ``-H`` hosts' free slots (:mod:`.joiner_placement`). Ray Core actors are
the other provider (:mod:`.ray_provider`, :mod:`.ray_worker_actor`).
"""
