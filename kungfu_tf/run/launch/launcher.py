"""``kungfu-run`` entry point: parse, plan, then supervise the workers."""

import os
from collections.abc import Sequence

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.launch.grpc_fork_safety import disable_grpc_fork_handlers
from kungfu_tf.run.launch.supervisor import JobSupervisor
from kungfu_tf.run.plan.cli import LaunchOptions, parse_args
from kungfu_tf.run.plan.job_plan import build_plan
from kungfu_tf.run.providers.output import Console
from kungfu_tf.run.providers.startup_noise import hide_tf_startup
from kungfu_tf.run.worker_env.cpu_binding import BIND_ENV


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kungfu-run`` with ``argv`` (default ``sys.argv[1:]``).

    Returns the exit status: 0 if every local worker succeeded, the first
    failing worker's status (128+N for signal N), 128+N if the launcher
    was stopped by signal N, 127 if PROGRAM cannot be started and 2 for
    usage errors.
    """
    try:
        options = parse_args(argv)
    except SystemExit as e:
        # argparse exits on errors and --help; return the status instead
        # so that callers embedding main() are not terminated.
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)

    if options.bind_to is not None:
        # Every launch path gives the workers this process's environment (cpu_binding.py pins them).
        os.environ[BIND_ENV] = options.bind_to
    console = Console(
        hide_tf_startup=hide_tf_startup(options.tf_startup_logs, os.environ),
        status_every=options.status_every,
    )
    if options.on_ray:
        return _run_on_ray(options, console)
    if options.elastic:
        return _run_elastic(options, console)
    try:
        plan = build_plan(options, os.environ)
        if plan.logdir is not None:
            try:
                plan.logdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LaunchError(
                    f"cannot create --logdir {plan.logdir}: {e.strerror}"
                ) from None
    except LaunchError as e:
        console.message(f"error: {e}")
        return 2

    if not plan.local_peers:
        console.message(
            f"no workers are placed on {plan.self_host}; nothing to run here"
        )
        return 0
    return JobSupervisor(plan, console, os.environ).run()


def _run_elastic(options: LaunchOptions, console: Console) -> int:
    """``--elastic``/``--min-np``: the cluster may change while the job runs."""
    # Workers get the environment as the user set it.
    base_env = dict(os.environ)
    try:
        disable_grpc_fork_handlers()
    except RuntimeError as e:
        console.message(f"error: {e}")
        return 2
    # Imported here, after the line above: they import gRPC (which a job of
    # fixed size does not need, so it starts faster without).
    from kungfu_tf.run.launch.elastic_supervisor import ElasticSupervisor
    from kungfu_tf.run.plan.elastic_plan import build_elastic_plan

    try:
        plan = build_elastic_plan(options, os.environ)
        if plan.logdir is not None:
            try:
                plan.logdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LaunchError(f"cannot create --logdir {plan.logdir}: {e.strerror}") from None
    except LaunchError as e:
        console.message(f"error: {e}")
        return 2
    return ElasticSupervisor(plan, console, base_env).run()


def _run_on_ray(options: LaunchOptions, console: Console) -> int:
    """``--ray ADDRESS``: every worker is a subprocess of its own Ray actor."""
    # Workers get the environment as the user set it (not Ray's additions).
    base_env = dict(os.environ)
    from kungfu_tf.run.launch.ray_job import run_on_ray

    return run_on_ray(options, console, base_env)
