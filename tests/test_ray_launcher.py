"""``kungfu-run --ray ADDRESS``: workers as subprocesses of Ray actors, on Ray's test clusters.

The jobs run tests/workers/elastic_fake_worker.py (the config service's
client alone, no TensorFlow) on one machine:

* ``ray.cluster_utils.Cluster``: a node that runs a worker is removed (the
  worker is lost and replaced on another node), the job grows (no room: a
  node is added, as an autoscaler would) and shrinks (the member left out
  detaches, then its actor goes);
* ``ray.cluster_utils.AutoscalingCluster`` with the fake multi-node
  provider: a grow makes the autoscaler start a node for the joiner.

Every worker prints whether Ray is imported in it (it must not be), and
after each job no worker process, and after each cluster no Ray process, is
left. All fake nodes share one IP: workers are told apart by port and node.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, kill_tree, worker_env, worker_path

# An optional extra of the package, but `make install` installs it: CI tests it.
from ray.cluster_utils import AutoscalingCluster, Cluster

from kungfu_tf.run import ray_launch
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.cli import parse_args_or_raise

FAKE = worker_path("elastic_fake_worker.py")
VENV_BIN = str(Path(sys.executable).parent)
# Processes of a Ray cluster (and its workers) on this machine.
RAY_PROCESS = re.compile(
    r"(raylet|gcs_server|ray::|default_worker\.py|ray/dashboard|log_monitor\.py|monitor\.py --logs)"
)


# Ray's own start of a node (before any of our code runs) must see its raylet registered within a hard-coded
# 30 s (ray/_private/node.py), and the raylet itself waits a hard-coded 15 s for its agents
# (ray-project/ray#65983): a loaded 2-core machine can miss either, and then the node's processes are
# stopped and "timed out during startup" raised. Such a start is tried again; any other error is not.
RAY_START_TRIES = 3


def ray_started(start: Callable[[], Any]) -> Any:
    """``start()`` (a Ray node or cluster coming up), tried again when Ray's own start-up timed out."""
    for attempt in range(1, RAY_START_TRIES + 1):
        try:
            return start()
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == RAY_START_TRIES:
                raise
            print(f"Ray's start-up timed out (try {attempt} of {RAY_START_TRIES}): {e}", file=sys.stderr)
    raise AssertionError("unreachable")


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "kungfu_tf.run", *args]


def events(out: str) -> list[str]:
    return [
        line[len("[kungfu-run] ") :]
        for line in out.splitlines()
        if line.startswith("[kungfu-run] ")
    ]


def processes_matching(pattern: re.Pattern[str] | str) -> list[str]:
    """Command lines of this user's processes that match ``pattern``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = (
                Path(f"/proc/{pid}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        if re.search(pattern, cmdline):
            found.append(f"{pid}: {cmdline[:200]}")
    return found


def wait_gone(pattern: re.Pattern[str] | str, timeout: float) -> list[str]:
    """Wait until no process matches; what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (left := processes_matching(pattern)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def reap_ray_processes(timeout: float) -> list[str]:
    """Ray's processes still running ``timeout`` s after the cluster's shutdown, killed; what the kill left.

    Ray's own daemons stop on their own schedule: in a fresh-clone CI at 97e85db a GCS server that had
    missed an RPC deadline during the shutdown ("Failed to get node info ... Deadline Exceeded") was still
    running 15 s later, after every check of the job had passed. The workers the launcher started are
    checked apart, before the shutdown (they must be gone); Ray's teardown is Ray's, and is only finished
    here (SIGKILL), so that no later test meets its processes. Nothing may survive the kill.
    """
    left = wait_gone(RAY_PROCESS, timeout)
    for line in left:
        try:
            os.kill(int(line.split(":", 1)[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    if left:
        print(f"killed Ray processes that outlived the cluster's shutdown by {timeout:g} s: {left}", file=sys.stderr)
    return wait_gone(RAY_PROCESS, 10)


def ray_env() -> dict[str, str]:
    # The `ray` CLI (AutoscalingCluster runs it) from this venv.
    env = worker_env(PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("RAY_ADDRESS", None)
    return env


class Job:
    """A ``kungfu-run --ray`` job whose merged output is read line by line (for reacting to it)."""

    def __init__(self, args: list[str]):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            launcher(*args),
            cwd=REPO_ROOT,
            env=ray_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def follow(self, react, timeout: float) -> int:
        """Read every line (calling ``react(line)``) until the launcher ends; its status."""
        timer = threading.Timer(timeout, kill_tree, args=(self.proc.pid,))
        timer.start()
        try:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                react(line.rstrip("\n"))
            return self.proc.wait()
        finally:
            timer.cancel()
            if self.proc.poll() is None:
                kill_tree(self.proc.pid)
                self.proc.wait()

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def node_with_prefix(nodes, prefix: str):
    return next(n for n in nodes if n.node_id.startswith(prefix))


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    "args, message",
    [
        (["--ray", "h:1", "-H", "a:2"], "-H a:2 does not apply with --ray h:1"),
        (
            ["--ray", "h:1", "--port-range", "1-9"],
            "--port-range 1-9 does not apply with --ray h:1",
        ),
        (
            ["--ray", "h:1", "--elastic", "--config-server", "h:7"],
            "--config-server h:7 does not apply with --ray",
        ),
        (["--ray-cpus-per-worker", "2"], "--ray-cpus-per-worker 2 needs --ray"),
        (
            ["--ray", "h:1", "--ray-cpus-per-worker", "0"],
            "--ray-cpus-per-worker must be a number of CPUs > 0, got 0",
        ),
        (["--ray", " "], "--ray needs the Ray cluster's address"),
    ],
)
def test_inconsistent_ray_options_are_named(args, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        parse_args_or_raise(["-np", "2", *args, "prog"])


def test_ray_launch_names_bad_arguments():
    with pytest.raises(ValueError, match=re.escape("-np must be at least 1, got 0")):
        ray_launch(["prog"], address="h:1", np=0)
    with pytest.raises(
        ValueError, match="command must be a non-empty list of strings, got 'prog'"
    ):
        ray_launch("prog", address="h:1", np=1)


def test_ray_launch_names_an_unreachable_cluster(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert ray_launch([sys.executable, FAKE, "grow", "1"], address=f"127.0.0.1:{port}", np=1) == 2
    err = capsys.readouterr().err
    assert f"error: cannot reach the Ray cluster at --ray 127.0.0.1:{port}: Connection refused" in err, err


def test_unreachable_ray_cluster_is_named_quickly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    address = f"127.0.0.1:{port}"
    res = subprocess.run(
        launcher("--ray", address, "-np", "1", sys.executable, FAKE, "grow", "1"),
        cwd=REPO_ROOT,
        env=ray_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2, res.stderr
    assert (
        f"error: cannot reach the Ray cluster at --ray {address}: Connection refused"
        in res.stderr
    ), res.stderr
    # Named by our connect check ("Connection refused" from it), not by
    # ray.init after its own retries: the message tells, not the clock.


def test_missing_ray_names_the_extra(tmp_path):
    # A `ray` package that fails to import as an absent one does.
    shadow = tmp_path / "ray"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n"
    )
    env = ray_env()
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    res = subprocess.run(
        launcher("--ray", "127.0.0.1:1", "-np", "1", sys.executable, FAKE, "grow", "1"),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2, res.stderr
    assert (
        "error: --ray needs Ray Core, which is not installed here (No module named 'ray'): "
        "pip install kungfu_tf[ray]" in res.stderr
    ), res.stderr


# ------------------------------------------------------------ clusters


def test_removed_node_is_replaced_and_the_job_grows_and_shrinks():
    """Cluster: head without CPUs, 3 one-CPU nodes; np=2 --elastic --max-np 3.

    The node of rank 1 is removed: its worker is lost (v2) and a joiner is
    placed on the third node (v3). Rank 0 then asks for 3 workers: no CPU is
    free, the launcher asks Ray for one more bundle and the test adds a node
    (v4); rank 0 commits the first two (v5): the third detaches, its actor
    and placement group go. Then, on the same cluster, a job of fixed size
    fails when a worker dies, and SIGTERM stops a running job's workers.
    """
    cluster = ray_started(lambda: Cluster(initialize_head=True, head_node_args={"num_cpus": 0}))
    try:
        nodes = [ray_started(lambda: cluster.add_node(num_cpus=1)) for _ in range(3)]
        cluster.wait_for_nodes()
        job = Job(
            [
                "--ray",
                cluster.address,
                "-np",
                "2",
                "--elastic",
                "--max-np",
                "3",
                "--join-timeout",
                "60",
                sys.executable,
                FAKE,
                "lose-grow-shrink",
                "2",
            ]
        )
        removed, added = [], []

        def react(line: str) -> None:
            m = re.search(
                r"Ray placed 2 worker\(s\): \S+ on node (\w+), \S+ on node (\w+)$", line
            )
            if m and not removed:
                removed.append(node_with_prefix(nodes, m.group(2)))
            if (
                re.fullmatch(r"\[[01]\] ray imported: False", line)
                and removed
                and not getattr(react, "done", False)
            ):
                react.done = (
                    sum(
                        bool(re.fullmatch(r"\[[01]\] ray imported: False", x))
                        for x in job.lines
                    )
                    == 2
                )
                if react.done:
                    cluster.remove_node(removed[0])
            if (
                "asked Ray for 1 worker more" in line
                and "target 3 workers" in line
                and not added
            ):
                added.append(ray_started(lambda: cluster.add_node(num_cpus=1)))

        status = job.follow(react, timeout=90)
        out = job.output
        assert status == 0, out
        worker_left = wait_gone(re.escape(FAKE), 10)
        assert not worker_left, worker_left
        ev = events(out)
        gone = removed[0].node_id
        lost = re.search(
            r"cluster v2: 2 -> 1 workers \(lost (\S+): its Ray actor or node died\)",
            out,
        )
        assert lost, out
        replaced = re.search(
            r"placed joiner (\S+) on Ray node (\w+) \(target 2 workers\)", out
        )
        assert replaced and replaced.group(2) != gone, out
        assert f"cluster v3: 1 -> 2 workers (admitted {replaced.group(1)})" in ev, out
        grown = re.search(
            r"placed joiner (\S+) on Ray node (\w+) \(target 3 workers\)", out
        )
        assert grown and added and grown.group(2) == added[0].node_id, out
        assert f"cluster v4: 2 -> 3 workers (admitted {grown.group(1)})" in ev, out
        assert f"cluster v5: 3 -> 2 workers (left {grown.group(1)})" in ev, out
        assert ev[-1] == "all 2 members of cluster v5 finished", out
        assert re.search(r"^\[3\] detached$", out, re.MULTILINE), out
        # The member left the cluster first, then its actor went and the request dropped.
        # (the members finish about when it detaches: the count it leaves varies)
        released = [i for i, e in enumerate(ev) if e.startswith(f"released the Ray actor and placement group of {grown.group(1)} ")]
        assert released and ev.index(f"cluster v5: 3 -> 2 workers (left {grown.group(1)})") < released[0], out
        # Every slot is given back once the job is over: the request is 0 bundles.
        assert sum(e.startswith("released the Ray actor") for e in ev) == 4, out
        assert [e for e in ev if e.startswith("released")][-1].endswith("(asking Ray for 0 bundle(s) now)"), out
        assert f"worker [1] {lost.group(1)} its Ray actor or node died" in out, out
        # Four workers ran; none imported Ray.
        assert (
            len(re.findall(r"^\[\d\] ray imported: False$", out, re.MULTILINE)) == 4
        ), out
        assert "ray imported: True" not in out

        # The same cluster: a job of fixed size fails when a worker dies ...
        job = Job(["--ray", cluster.address, "-np", "2", sys.executable, FAKE, "die", "1@1"])
        status = job.follow(lambda line: None, timeout=60)
        assert status == 1, job.output
        assert "error: cluster fell to 1 worker, below the job's minimum of 2 workers" in job.output, job.output
        assert "unless --elastic or a lower --min-np is given" in job.output, job.output
        # ... and SIGTERM stops every worker through its actor.
        job = Job(["--ray", cluster.address, "-np", "2", sys.executable, FAKE, "die", "5@99"])

        def stop_when_both_run(line: str) -> None:
            if sum(x.endswith("ray imported: False") for x in job.lines) == 2 and line.endswith("False"):
                job.proc.send_signal(signal.SIGTERM)

        status = job.follow(stop_when_both_run, timeout=60)
        assert status == 128 + signal.SIGTERM, job.output
        assert "received SIGTERM, stopping workers" in job.output
        worker_left = wait_gone(re.escape(FAKE), 10)
        assert not worker_left, worker_left
    finally:
        cluster.shutdown()
    left = reap_ray_processes(15)
    assert not left, left


class FakeMultiNodeCluster(AutoscalingCluster):
    """Ray's autoscaling test cluster (fake multi-node provider) with the config written out here.

    The wheel lacks the example YAML that AutoscalingCluster reads; this is
    the documented format of an autoscaler config for that provider.
    """

    def _generate_config(
        self, head_resources, worker_node_types, autoscaler_v2=False, **config_kwargs
    ):
        config = {
            "cluster_name": "kungfu-test",
            "max_workers": 8,
            "provider": {
                "type": "fake_multinode",
                "use_node_id_as_ip": True,
                "disable_node_updaters": True,
                "disable_launch_config_check": True,
            },
            "available_node_types": {
                **worker_node_types,
                "ray.head.default": {
                    "resources": head_resources,
                    "node_config": {},
                    "max_workers": 0,
                },
            },
            "head_node_type": "ray.head.default",
            "auth": {},
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 0.1,
            "docker": {},
            "file_mounts": {},
            "cluster_synced_files": [],
            "file_mounts_sync_continuously": False,
            "rsync_exclude": [],
            "rsync_filter": [],
        }
        for key in (
            "initialization_commands",
            "setup_commands",
            "head_setup_commands",
            "worker_setup_commands",
            "head_start_ray_commands",
            "worker_start_ray_commands",
        ):
            config[key] = []
        config.update(config_kwargs)
        return config


def test_grow_makes_the_autoscaler_start_a_node(monkeypatch):
    """AutoscalingCluster: one one-CPU node to start with (min_workers 1); a grow to 2 needs a new one."""
    assert shutil.which("ray", path=VENV_BIN), "the ray CLI is missing from the venv"
    monkeypatch.setenv("PATH", f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    cluster = FakeMultiNodeCluster(
        head_resources={"CPU": 0},
        worker_node_types={
            "cpu_node": {
                "resources": {"CPU": 1},
                "node_config": {},
                "min_workers": 1,
                "max_workers": 2,
            }
        },
    )
    cluster.start()
    try:
        job = Job(
            [
                "--ray",
                "auto",
                "-np",
                "1",
                "--elastic",
                "--max-np",
                "2",
                "--join-timeout",
                "60",
                sys.executable,
                FAKE,
                "grow",
                "2",
            ]
        )
        status = job.follow(lambda line: None, timeout=90)
        out = job.output
        assert status == 0, out
        first = re.search(
            r"Ray placed 1 worker\(s\): (\S+) on node (\w+)$", out, re.MULTILINE
        )
        joined = re.search(
            r"placed joiner (\S+) on Ray node (\w+) \(target 2 workers\)", out
        )
        assert first and joined, out
        assert (
            "asked Ray for 1 worker more (bundle {'CPU': 1.0} each; target 2 workers)"
            in out
        ), out
        # The fake provider's node ids count up: the joiner's node is a new one.
        assert joined.group(2) != first.group(2), out
        assert f"cluster v2: 1 -> 2 workers (admitted {joined.group(1)})" in events(
            out
        ), out
        assert (
            len(re.findall(r"^\[\d\] ray imported: False$", out, re.MULTILINE)) == 2
        ), out
        worker_left = wait_gone(re.escape(FAKE), 10)
        assert not worker_left, worker_left
    finally:
        cluster.shutdown()
    left = reap_ray_processes(15)
    assert not left, left
