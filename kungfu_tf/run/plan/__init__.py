"""From the ``kungfu-run`` command line to the plan of a job, before anything starts.

:mod:`.cli` parses and checks the options (:class:`~.cli.LaunchOptions`);
:mod:`.job_plan` (fixed size) and :mod:`.elastic_plan` turn them into peers,
ports and environments, with :mod:`.ports`, :mod:`.topology`,
:mod:`.local_host` (which ``-H`` host this is) and :mod:`.host_discovery`
(``--host-discovery-script``). Pure decisions: nothing here starts a process.
"""
