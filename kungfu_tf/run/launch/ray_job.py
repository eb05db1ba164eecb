"""Running a job's workers on a Ray cluster: ``kungfu-run --ray ADDRESS`` and :func:`ray_launch`.

The launcher joins the Ray cluster as a driver, creates one slot (placement
group + actor, kungfu_tf/run/providers/ray_provider.py) per initial worker, waits until
Ray placed them, commits the peers their actors reported as cluster
version 1, and then supervises the job exactly as ``kungfu-run --elastic``
does (kungfu_tf/run/launch/elastic_supervisor.py), with Ray providing the workers.
Without ``--elastic`` or ``--min-np`` the job has a fixed size: losing any
worker fails it (``--min-np`` = ``-np``), as a local job of fixed size does.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.cli import (
    DEFAULT_JOIN_TIMEOUT,
    DEFAULT_TIMEOUT,
    LaunchOptions,
    parse_args_or_raise,
)
from kungfu_tf.run.plan.topology import DEFAULT_TOPOLOGY
from kungfu_tf.run.providers.output import Console

if TYPE_CHECKING:
    from kungfu_tf.run.providers.ray_provider import RayActors


def ray_launch(
    command: Sequence[str],
    *,
    address: str,
    np: int,
    elastic: bool = False,
    min_np: int | None = None,
    max_np: int | None = None,
    cpus_per_worker: float = 1.0,
    timeout: int = DEFAULT_TIMEOUT,
    join_timeout: float = DEFAULT_JOIN_TIMEOUT,
    topology: str = DEFAULT_TOPOLOGY,
    logdir: str | Path | None = None,
    quiet: bool = False,
) -> int:
    """Run ``command`` as ``np`` workers on the Ray cluster at ``address``; the job's exit status.

    The same as ``kungfu-run --ray ADDRESS -np NP [--elastic] [--min-np A]
    [--max-np B] ... COMMAND``; run it from a process that is not a Ray
    worker itself (it joins the cluster as a driver and leaves it at the end).

    Example::

        from kungfu_tf.run import ray_launch

        status = ray_launch(["python", "train.py"], address="10.0.0.1:6379", np=2, elastic=True, max_np=8)

    Raises:
        ValueError: a bad argument, naming it and its value.
    """
    argv = [
        "-np",
        str(np),
        "--ray",
        address,
        "--ray-cpus-per-worker",
        repr(float(cpus_per_worker)),
    ]
    argv += ["--timeout", str(timeout), "--topology", topology]
    if elastic:
        argv += ["--elastic", "--join-timeout", repr(float(join_timeout))]
    if min_np is not None:
        argv += ["--min-np", str(min_np)]
    if max_np is not None:
        argv += ["--max-np", str(max_np)]
    if logdir is not None:
        argv += ["--logdir", str(logdir)]
    if quiet:
        argv.append("--quiet")
    if not command or isinstance(command, str):
        raise ValueError(
            f"ray_launch: command must be a non-empty list of strings, got {command!r}"
        )
    try:
        options = parse_args_or_raise([*argv, "--", *command])
    except LaunchError as e:
        raise ValueError(f"ray_launch: {e}") from None
    return run_on_ray(options, Console(), dict(os.environ))


def run_on_ray(
    options: LaunchOptions, console: Console, base_env: Mapping[str, str]
) -> int:
    """Run the job of ``options`` (``options.on_ray``) and return its status (2: it could not start)."""
    from kungfu_tf.run.launch.elastic_supervisor import ElasticSupervisor
    from kungfu_tf.run.plan.elastic_plan import plan_with_options
    from kungfu_tf.run.providers.ray_provider import RayActors, connect, import_ray
    from kungfu_tf.run.worker_env.job_id import resolve_job_id
    from kungfu_tf.run.worker_env.job_secret import resolve_job_secret

    assert options.ray_address is not None
    provider = None
    try:
        ray = import_ray()
        connect(ray, options.ray_address)
        provider = RayActors(ray, console, cpus_per_worker=options.ray_cpus_per_worker)
        console.event(
            f"connected to the Ray cluster at {options.ray_address}: {_resources_text(ray)}"
        )
        peers = provider.start_initial(options.np, timeout=options.timeout)
        if options.logdir is not None:
            try:
                options.logdir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LaunchError(
                    f"cannot create --logdir {options.logdir}: {e.strerror}"
                ) from None
        config_host = ray.util.get_node_ip_address()
        plan = plan_with_options(
            options,
            serves=True,
            config_host=config_host,
            config_port=0,
            self_host=config_host,
            initial_peers=peers,
            hosts=[],
            port_range=None,
            min_np=options.min_np
            if options.min_np is not None
            else (1 if options.replace_crashed else options.np),
            max_np=options.max_np if options.max_np is not None else options.np,
            discovery_script=None,
            # Workers get the secret from this launcher's environment (no
            # other launcher needs to share it).
            job_id=resolve_job_id(base_env, False),
            secret=resolve_job_secret(base_env, False),
        )
    except LaunchError as e:
        console.message(f"error: {e}")
        if provider is not None:
            provider.close()
        elif _ray_connected():
            _shutdown_ray()
        return 2
    placed = ", ".join(f"{p.address} on node {_node_id(provider, p.address)}" for p in peers)
    console.event(f"Ray placed {len(peers)} worker(s): {placed}")
    return ElasticSupervisor(plan, console, base_env, provider=provider).run()


def _node_id(provider: RayActors, address: str) -> str:
    """The Ray node whose actor runs the worker at ``address``."""
    slot = provider.slot_of(address)
    return slot.node_id if slot is not None else "(unknown)"


def _resources_text(ray) -> str:
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = ray.cluster_resources().get("CPU", 0)
    return f"{len(nodes)} node(s), {cpus:g} CPU(s)"


def _ray_connected() -> bool:
    import sys

    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _shutdown_ray() -> None:
    import sys

    sys.modules["ray"].shutdown()
