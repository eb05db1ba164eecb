"""``kungfu-run --elastic`` / ``--min-np``: the launcher of an elastic job.

The jobs here run tests/workers/elastic_fake_worker.py, which plays a worker
with the config service's client alone (no TensorFlow), so each job takes
about a second: the launcher's reactions (replacing a crashed worker,
starting joiners, giving up on rejected ones, evicting a removed host,
failing below --min-np) are what is tested. The two-host test runs one
launcher per network namespace.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO_ROOT, finish_job, kill_tree, worker_env, worker_path
from netns import make_two_hosts

from benchmarks.harness.port_block import free_port_block
from kungfu_tf.run.control.membership_change import describe_change
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.plan.elastic_plan import build_elastic_plan
from kungfu_tf.run.plan.host_discovery import (
    parse_discovery_output,
    run_discovery_script,
)
from kungfu_tf.run.plan.ports import PortRange
from kungfu_tf.run.providers.joiner_placement import JoinerPlacer, NoPortLeft
from kungfu_tf.run.worker_env.placement import HostSlots

FAKE = worker_path("elastic_fake_worker.py")
SECRET = "0123456789abcdef" * 4
PEER = r"127\.0\.0\.1:\d+"


# kungfu-run with another SIGTERM -> SIGKILL grace than GRACE_SECONDS (5 s), to keep tests short.
LAUNCHER_WITH_GRACE = (
    "import sys; from kungfu_tf.run.launch.grpc_fork_safety import disable_grpc_fork_handlers; "
    "disable_grpc_fork_handlers(); from kungfu_tf.run.launch.elastic_supervisor import ElasticSupervisor; "
    "ElasticSupervisor.__init__.__kwdefaults__['grace'] = {grace}; "
    "from kungfu_tf.run.launch.launcher import main; sys.exit(main(sys.argv[1:]))"
)


def launcher(*args: str, grace: float | None = None) -> list[str]:
    if grace is not None:
        return [sys.executable, "-c", LAUNCHER_WITH_GRACE.format(grace=float(grace)), *args]
    return [sys.executable, "-m", "kungfu_tf.run", *args]


def run_elastic(
    *args: str, timeout: float = 60, env: dict[str, str] | None = None, grace: float | None = None
) -> tuple[int, str, str]:
    """Run ``kungfu-run ARGS`` (ending in the fake worker's MODE ARG) to completion."""
    *launcher_args, mode, arg = args
    proc = subprocess.Popen(
        launcher(*launcher_args, sys.executable, FAKE, mode, arg, grace=grace),
        cwd=REPO_ROOT,
        env=env or worker_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return finish_job(proc, timeout)


def events(err: str) -> list[str]:
    """The launcher's ``[kungfu-run] ...`` lines."""
    return [line[len("[kungfu-run] ") :] for line in err.splitlines() if line.startswith("[kungfu-run] ")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- options


@pytest.mark.parametrize(
    "args, message",
    [
        (["-np", "3", "--elastic", "--max-np", "2"], "-np 3 exceeds --max-np 2"),
        (["-np", "2", "--elastic", "--max-np", "0"], "--max-np must be at least 1, got 0"),
        (["-np", "2", "--min-np", "3"], "--min-np 3 exceeds -np 2"),
        (["-np", "2", "--min-np", "0"], "--min-np must be at least 1, got 0"),
        (["-np", "2", "--min-np", "1", "--max-np", "4"], "--max-np 4 needs --elastic"),
        (["-np", "2", "--config-server", "h:7000"], "--config-server h:7000 is only used by elastic jobs"),
        (["-np", "2", "--elastic", "--config-server", "h:70000"], "bad --config-server 'h:70000'"),
        (["-np", "2", "--elastic", "--config-server", "h"], "bad --config-server 'h'"),
        (["-np", "2", "--min-np", "1", "--host-discovery-script", "x"], "--host-discovery-script needs --elastic"),
        (["-np", "2", "--elastic", "-H", "a:2", "--host-discovery-script", "x"], "either -H or --host-discovery-script"),
        (["-np", "2", "--min-np", "1", "--join-timeout", "5"], "--join-timeout 5 needs --elastic"),
        (["-np", "2", "--elastic", "--join-timeout", "0"], "--join-timeout must be a number of seconds > 0, got 0"),
        (["-np", "2", "--elastic", "--join-timeout", "nan"], "--join-timeout must be a number of seconds > 0, got nan"),
        (["-np", "2", "--min-np", "1", "--admit-window", "2"], "--admit-window 2 needs --elastic"),
        (["-np", "2", "--elastic", "--admit-window", "-1"], "--admit-window must be a number of seconds >= 0, got -1"),
        (["-np", "2", "--elastic", "--admit-window", "inf"], "--admit-window must be a number of seconds >= 0, got inf"),
    ],
)
def test_inconsistent_elastic_options_are_named(capsys, args, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args([*args, "prog"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_elastic_options_are_read():
    options = parse_args(["-np", "2", "--elastic", "--min-np", "1", "--max-np", "4", "prog"])
    assert (options.elastic, options.replace_crashed, options.min_np, options.max_np) == (True, True, 1, 4)
    assert options.join_timeout == 600  # TF warm-up (imports, tracing) can be slow
    assert parse_args(["-np", "1", "--elastic", "--join-timeout", "2.5", "p"]).join_timeout == 2.5
    assert options.admit_window == 5  # joiners of one growth are admitted together
    assert parse_args(["-np", "1", "--elastic", "--admit-window", "0", "p"]).admit_window == 0
    survive_only = parse_args(["-np", "2", "--min-np", "1", "prog"])
    assert (survive_only.elastic, survive_only.replace_crashed) == (True, False)
    assert not parse_args(["-np", "2", "prog"]).elastic


def test_elastic_plan_checks_slots_and_the_config_service():
    with pytest.raises(LaunchError, match=r"--max-np 5 exceeds the 4 slots of -H 127.0.0.1:4"):
        build_elastic_plan(parse_args(["-np", "2", "--elastic", "--max-np", "5", "-H", "127.0.0.1:4", "p"]), {})
    with pytest.raises(LaunchError, match=r"needs --config-server HOST:PORT on every launcher"):
        build_elastic_plan(parse_args(["-np", "2", "--elastic", "-H", "127.0.0.1:1,10.9.9.9:1", "p"]), {})
    with pytest.raises(LaunchError, match=r"--config-server host localhost is not one of the hosts \(127.0.0.1\)"):
        build_elastic_plan(parse_args(["-np", "2", "--elastic", "--config-server", "localhost:7000", "p"]), {})
    plan = build_elastic_plan(parse_args(["-np", "2", "--elastic", "--max-np", "3", "p"]), {})
    assert (plan.serves, plan.config_host, plan.hosts, plan.port_range) == (
        True, "127.0.0.1", [HostSlots("127.0.0.1", 3)], None)
    assert len(plan.initial_peers) == 2 and SECRET not in repr(plan)
    env = {"KUNGFU_JOB_SECRET": SECRET, "KUNGFU_JOB_ID": "j"}
    other = build_elastic_plan(parse_args(["-np", "2", "--elastic", "-H", "127.0.0.1:1,10.9.9.9:1", "--self",
                                           "127.0.0.1", "--config-server", "10.9.9.9:7000", "p"]), env)
    assert (other.serves, other.initial_peers, other.config_address) == (False, [], "10.9.9.9:7000")


# ------------------------------------------------------- host discovery


def test_discovery_output_is_parsed_in_order():
    assert parse_discovery_output("a:2\n\n  b:1  \n", "s") == [HostSlots("a", 2), HostSlots("b", 1)]
    assert parse_discovery_output("", "s") == []


@pytest.mark.parametrize(
    "text, message",
    [
        ("a:2\nb\n", "line 2 'b': expected host:slots"),
        ("a:2\n\nb:x\n", "line 3 'b:x': slots must be a whole number >= 1, got 'x'"),
        ("a:0\n", "line 1 'a:0': slots must be a whole number >= 1, got '0'"),
        ("a:1\na:2\n", "line 2 'a:2': host 'a' is listed twice"),
        ("::1:2\n", "line 1 '::1:2': expected host:slots"),
    ],
)
def test_bad_discovery_output_names_the_line(text, message):
    with pytest.raises(LaunchError) as err:
        parse_discovery_output(text, "hosts.sh")
    assert f"--host-discovery-script hosts.sh: {message}" in str(err.value)


def test_failing_discovery_script_is_reported(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 'no cluster manager' >&2\nexit 3\n")
    script.chmod(0o755)
    with pytest.raises(LaunchError, match=r"failed with exit code 3: no cluster manager"):
        run_discovery_script(script)
    with pytest.raises(LaunchError, match=r"cannot run --host-discovery-script .*missing"):
        run_discovery_script(tmp_path / "missing")


# --------------------------------------------------- placement and lines


def test_joiners_fill_slots_in_host_order_with_fresh_ports():
    placer = JoinerPlacer(PortRange(10000, 10002), local_host="10.0.0.1")
    hosts = [HostSlots("10.0.0.1", 1), HostSlots("10.0.0.2", 2)]
    placer.note_used("10.0.0.1", 10000)
    placer.note_used("10.0.0.2", 10000)
    assert placer.place(hosts, {"10.0.0.1": 1, "10.0.0.2": 1}) == ("10.0.0.2", 10001)
    # The worker at 10001 died: its slot is free again, its port is not.
    assert placer.place(hosts, {"10.0.0.1": 1, "10.0.0.2": 1}) == ("10.0.0.2", 10002)
    assert placer.place(hosts, {"10.0.0.1": 1, "10.0.0.2": 2}) is None
    with pytest.raises(NoPortLeft, match="every port of --port-range 10000-10002 on 10.0.0.2 was used"):
        placer.place(hosts, {"10.0.0.1": 1, "10.0.0.2": 1})


def test_membership_lines():
    assert describe_change(3, ["h:1", "h:2"], ["h:1"], "lost h:2: killed by SIGKILL") == (
        "cluster v3: 2 -> 1 workers (lost h:2: killed by SIGKILL)")
    # PutCluster commits say nothing: the difference is described instead.
    assert describe_change(4, ["h:1", "h:2", "h:3"], ["h:1", "h:4"], "put_cluster", {"h:2": "exit code 1"}) == (
        "cluster v4: 3 -> 2 workers (lost h:2: exit code 1; left h:3; joined h:4)")


# ----------------------------------------------------- single-host jobs


def test_grow_starts_a_joiner_that_is_admitted():
    rc, out, err = run_elastic("-np", "2", "--elastic", "--max-np", "3", "grow", "3")
    assert rc == 0, err
    lines = events(err)
    assert re.fullmatch(r"config service at 127\.0\.0\.1:\d+", lines[0]), lines
    assert lines[1] == "cluster v1: 2 workers (min 1, max 3, target 2)"
    started = [m.group(1) for m in map(re.compile(rf"started joiner \[2\] ({PEER})").fullmatch, lines) if m]
    assert len(started) == 1, lines
    assert f"cluster v2: 2 -> 3 workers (admitted {started[0]})" in lines
    assert f"[2] joiner {started[0]} v0 elastic=True" in out.splitlines()
    assert "[2] admitted at v2 as rank 2 of 3" in out.splitlines()
    assert sorted(re.findall(r"^\[(\d)\] saw 3 workers at v2$", out, re.MULTILINE)) == ["0", "1"]


def test_joiners_of_one_growth_are_admitted_in_one_version():
    """Two joiners ready 1 s apart join in one version (the admission window),
    and in two with --admit-window 0 (each as soon as it is ready: the second
    reports READY only once the first was admitted, whatever the machine's speed)."""
    for window, stagger, expected_versions in (("5", "1.0", 1), ("0", "after-first", 2)):
        rc, out, err = run_elastic("-np", "1", "--elastic", "--max-np", "3", "--admit-window", window,
                                   "grow-staggered", f"3:{stagger}")  # fmt: skip
        assert rc == 0, err
        started = re.findall(rf"started joiner \[\d\] ({PEER})", err)
        admitted = [line for line in events(err) if re.fullmatch(r"cluster v\d+: \d -> \d workers \(admitted .*\)", line)]
        assert len(started) == 2 and len(admitted) == expected_versions, (window, events(err))
        if expected_versions == 1:
            assert admitted == [f"cluster v2: 1 -> 3 workers (admitted {started[0]}, {started[1]})"]
            assert "[0] saw 3 workers at v2" in out.splitlines()
        else:
            assert admitted == [f"cluster v2: 1 -> 2 workers (admitted {started[0]})",
                                f"cluster v3: 2 -> 3 workers (admitted {started[1]})"]  # fmt: skip


def test_crashed_worker_is_reported_and_replaced():
    rc, out, err = run_elastic("-np", "3", "--elastic", "--min-np", "2", "crash", "2")
    assert rc == 0, err
    crashed = re.search(rf"^\[2\] member ({PEER}) v1", out, re.MULTILINE).group(1)
    lines = events(err)
    assert f"cluster v2: 3 -> 2 workers (lost {crashed}: killed by SIGKILL)" in lines, lines
    joiner = re.search(rf"started joiner \[3\] ({PEER})", err).group(1)
    assert joiner != crashed
    assert lines[-2:] == [f"cluster v3: 2 -> 3 workers (admitted {joiner})", "all 3 members of cluster v3 finished"]
    assert f"worker [2] {crashed} killed by signal SIGKILL" in err
    assert "[3] admitted at v3 as rank 2 of 3" in out.splitlines()


def test_min_np_without_elastic_survives_then_fails_below_it():
    # Rank 2 dies at v1 (survived, not replaced), rank 1 at v2: 1 < --min-np 2.
    rc, out, err = run_elastic("-np", "3", "--min-np", "2", "die", "2@1,1@2")
    assert rc == 1, err
    lines = events(err)
    rank = {int(r): p for r, p in re.findall(rf"^\[(\d)\] member ({PEER})", out, re.MULTILINE)}
    assert lines[1] == "cluster v1: 3 workers (min 2, max 3, target 3)"
    assert lines[2] == f"cluster v2: 3 -> 2 workers (lost {rank[2]}: killed by SIGKILL)", lines
    assert lines[3] == f"cluster v3: 2 -> 1 workers (lost {rank[1]}: killed by SIGKILL)", lines
    assert (
        f"kungfu-run: error: cluster fell to 1 worker, below --min-np 2 (lost {rank[1]}: killed by SIGKILL)" in err
    )
    assert "joiner" not in err  # no replacement without --elastic
    # Rank 0 (sleeping 600 s) was stopped, not waited for: the job ended
    # within run_elastic's 60 s (a hang bound, not a race with the clock).


def test_detached_worker_exits_cleanly_and_is_not_replaced():
    rc, out, err = run_elastic("-np", "3", "--elastic", "shrink", "2")
    assert rc == 0, err
    rank2 = re.search(rf"^\[2\] member ({PEER})", out, re.MULTILINE).group(1)
    assert "[2] detached" in out.splitlines()
    assert events(err)[2:] == [f"cluster v2: 3 -> 2 workers (left {rank2})", "all 2 members of cluster v2 finished"]
    assert "joiner" not in err


def test_rejected_joiners_are_given_up_after_three():
    rc, out, err = run_elastic("-np", "1", "--elastic", "--max-np", "2", "reject", "3")
    assert rc == 0, err
    started = re.findall(rf"started joiner \[\d\] ({PEER})", err)
    assert len(started) == 3, err
    for peer in started:
        assert f"joiner {peer} rejected: joiner {peer} has a different model: line 1: the job has " \
               "'w (2,) float32', the joiner has 'w (3,) float32'" in events(err)
    assert (
        f"giving up on starting joiners: 3 in a row ended before they were admitted "
        f"(the last, {started[-1]}: rejected); the job goes on with 1 worker" in err
    )
    assert "[0] saw 3 rejected joiners; 0 joiners now" in out.splitlines()
    assert "no free slot" not in err


def test_joiner_stuck_at_starting_is_withdrawn_after_the_join_timeout():
    """Joiners that never report READY are withdrawn (and stopped) after
    --join-timeout; each counts as a failure, so the third ends the tries."""
    start = time.monotonic()
    rc, out, err = run_elastic("-np", "1", "--elastic", "--max-np", "2", "--join-timeout", "1", "stuck", "3")
    assert rc == 0, err
    started = re.findall(rf"started joiner \[\d\] ({PEER})", err)
    assert len(started) == 3 and len(set(started)) == 3, err
    for peer in started:
        assert f"withdrawing joiner {peer}: still STARTING 1 s after it was placed (--join-timeout 1)" in err
        assert f"stopping joiner {peer}: it was withdrawn" in events(err)
    assert (
        f"giving up on starting joiners: 3 in a row ended before they were admitted "
        f"(the last, {started[-1]}: still STARTING after --join-timeout 1 s); the job goes on with 1 worker" in err
    )
    assert "[0] saw 3 joiners come and go; 0 joiners now" in out.splitlines()
    assert time.monotonic() - start < 120  # withdrawn after --join-timeout 1, not the default 600 s


def test_sigkill_after_sigterm_is_per_worker():
    """Stopping one worker (a withdrawn joiner that ignores SIGTERM) SIGKILLs
    that worker after the grace, and only it: the members, which run on well
    past the grace, are untouched (seen: one withdrawn joiner took every
    member down with it, "cluster fell to 1 worker, below --min-np 2")."""
    rc, out, err = run_elastic(
        "-np", "2", "--elastic", "--min-np", "2", "--max-np", "3", "--join-timeout", "3", "stuck-deaf", "2",
        grace=1,
    )
    assert rc == 0, err
    members = re.findall(rf"^\[\d\] member ({PEER})", out, re.MULTILINE)
    joiners = re.findall(rf"started joiner \[\d\] ({PEER})", err)
    killed = re.findall(rf"worker \[\d\] ({PEER}) still running 1s after SIGTERM, sending SIGKILL", err)
    assert len(members) == 2 and len(joiners) >= 2, err
    # The first withdrawn joiner, after its own grace (--join-timeout 3: it
    # ignores SIGTERM before its imports, well within 3 s of its start).
    assert killed[0] == joiners[0] and set(killed) <= set(joiners), err
    for rank in (0, 1):
        assert f"[{rank}] saw 2 joiners come and go" in out, out
    assert "below --min-np" not in err and "killed by" not in err


def test_joiner_whose_launcher_never_starts_it_is_withdrawn():
    """Joiners go to host .2 (.1's one slot is taken), whose launcher never
    runs: each is withdrawn after --join-timeout and placed again, three times."""
    first = free_port_block(10, hosts=("127.0.0.1", "127.0.0.2"))
    rc, out, err = run_elastic(
        "-np", "1", "--elastic", "--max-np", "2", "--join-timeout", "0.5", "-H", "127.0.0.1:1,127.0.0.2:1",
        "--config-server", f"127.0.0.1:{free_port()}", "--port-range", f"{first}-{first + 9}", "stuck", "3",
        env=worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=f"never-started-{os.getpid()}"),
    )
    assert rc == 0, err
    placed = [f"127.0.0.2:{first + i}" for i in range(3)]  # a fresh port each time
    for peer in placed:
        assert f"placed joiner {peer} (target 2 workers)" in events(err), err
        assert f"withdrawing joiner {peer}: still STARTING 0.5 s after it was placed" in err
    assert f"(the last, {placed[-1]}: still STARTING after --join-timeout 0.5 s)" in err
    assert "[0] saw 3 joiners come and go; 0 joiners now" in out.splitlines()


def test_member_crash_after_another_finished_fails_the_job(tmp_path):
    """The job ends well only when every member exits 0; once one finished,
    a crash is not replaced (the job is ending) and decides the status."""
    rc, out, err = run_elastic("-np", "2", "--elastic", "--min-np", "2", "finish-crash", str(tmp_path))
    assert rc == 128 + signal.SIGKILL, err
    assert "[1] killing myself" in out.splitlines()
    crashed = re.search(rf"^\[1\] member ({PEER})", out, re.MULTILINE).group(1)
    assert f"worker [1] {crashed} killed by signal SIGKILL" in err
    assert "joiner" not in err
    assert "below --min-np" not in err  # a finishing job is judged by exit codes


def test_sigterm_stops_every_worker(tmp_path):
    proc = subprocess.Popen(
        launcher("-np", "2", "--elastic", "--logdir", str(tmp_path), sys.executable, FAKE, "die", "9@99"),
        cwd=REPO_ROOT, env=worker_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("rank-*.log"))) < 2 or not all(
            f.read_text() for f in tmp_path.glob("rank-*.log")
        ):
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        rc, _, err = finish_job(proc, 30)  # the workers sleep 600 s: only the signal ends them in time
    finally:
        kill_tree(proc)
    assert rc == 128 + signal.SIGTERM, err
    assert "kungfu-run: received SIGTERM, stopping workers" in err
    assert "sending SIGKILL" not in err  # the workers ended on SIGTERM, within the grace
    # Stopping is not a membership change.
    assert [line for line in events(err) if line.startswith("cluster v")] == [
        "cluster v1: 2 workers (min 1, max 2, target 2)"]
    assert (tmp_path / "rank-0.log").read_text().startswith("member 127.0.0.1:")


def test_unreachable_config_service_fails_fast():
    port = free_port()
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID="unreachable")
    res = subprocess.run(
        launcher("-np", "2", "--elastic", "-H", "127.0.0.1:1,127.0.0.2:1", "--self", "127.0.0.2",
                 "--config-server", f"127.0.0.1:{port}", "--timeout", "2", sys.executable, FAKE, "grow", "2"),
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 2, res.stderr
    # Failed at its --timeout (the message says so), within subprocess.run's 60 s hang bound.
    assert f"cannot reach the config service at 127.0.0.1:{port} (--config-server) within --timeout 2 s" in res.stderr


def test_launcher_with_another_secret_is_refused(tmp_path):
    config = f"127.0.0.1:{free_port()}"
    common = ["-np", "1", "--elastic", "-H", "127.0.0.1:1,127.0.0.2:1", "--config-server", config]
    serving = subprocess.Popen(
        launcher(*common, "--logdir", str(tmp_path), sys.executable, FAKE, "die", "9@99"), cwd=REPO_ROOT,
        env=worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID="refused"), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "rank-0.log").exists() or not (tmp_path / "rank-0.log").read_text():
            assert time.monotonic() < deadline and serving.poll() is None, "the serving launcher did not start"
            time.sleep(0.05)
        res = subprocess.run(
            launcher(*common, "--self", "127.0.0.2", sys.executable, FAKE, "die", "9@99"), cwd=REPO_ROOT,
            env=worker_env(KUNGFU_JOB_SECRET="f" * 64, KUNGFU_JOB_ID="refused"),
            capture_output=True, text=True, timeout=60, check=False,
        )
    finally:
        kill_tree(serving)
    assert res.returncode == 2, res.stderr
    assert f"kungfu-run: error: the config service at {config} refused this launcher (PERMISSION_DENIED:" in res.stderr
    assert "export the same KUNGFU_JOB_SECRET and KUNGFU_JOB_ID on every host" in res.stderr


# ---------------------------------------- host discovery (two launchers)


def test_discovery_removes_a_host_and_evicts_its_worker(tmp_path):
    """127.0.0.1, .2 and .3 are three hosts of one machine, one launcher each.
    The script lists .1 and .2 first, then .1 and .3: the worker on .2 is
    evicted and (--elastic) replaced by a joiner on .3, whose launcher was
    started before the script listed its host."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1:2\n127.0.0.2:1\n")
    script = tmp_path / "hosts.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    config = f"127.0.0.1:{free_port()}"
    first = free_port_block(10, hosts=("127.0.0.1", "127.0.0.2"))
    common = ["-np", "3", "--elastic", "--host-discovery-script", str(script), "--config-server", config,
              "--port-range", f"{first}-{first + 9}"]
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=f"discovery-{os.getpid()}")
    # Output to files: the test reads launcher B's while the job runs.
    logs = [(tmp_path / f"out{i}.txt", tmp_path / f"err{i}.txt") for i in range(3)]
    procs = []
    for extra, (out_path, err_path) in zip(([], ["--self", "127.0.0.2"], ["--self", "127.0.0.3"]), logs):
        with open(out_path, "w") as out_f, open(err_path, "w") as err_f:
            procs.append(subprocess.Popen(launcher(*common, *extra, sys.executable, FAKE, "evict", "127.0.0.2"),
                                          cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out_f,
                                          stderr=err_f, text=True, start_new_session=True))  # fmt: skip
    member_b = f"[2] member 127.0.0.2:{first} v1 elastic=True"
    try:
        # The host list changes once .2's worker is a member of v1 (however long the launchers took to start).
        deadline = time.monotonic() + 60
        while member_b not in logs[1][0].read_text().splitlines():
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
                (p.poll(), o.read_text()[-3000:], e.read_text()[-3000:]) for p, (o, e) in zip(procs, logs)]
            time.sleep(0.1)
        (tmp_path / "next.txt").write_text("127.0.0.1:2\n127.0.0.3:1\n")
        (tmp_path / "next.txt").rename(hosts)
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            kill_tree(p)
    results = [(p.returncode, o.read_text(), e.read_text()) for p, (o, e) in zip(procs, logs)]
    (rc_a, out_a, err_a), (rc_b, out_b, err_b), (rc_c, out_c, err_c) = results
    assert (rc_a, rc_b, rc_c) == (0, 0, 0), (err_a, err_b, err_c)
    evicted, replacement = f"127.0.0.2:{first}", f"127.0.0.3:{first}"
    assert f"[2] member {evicted} v1 elastic=True" in out_b.splitlines()
    assert "[2] detached" in out_b.splitlines()
    assert sorted(re.findall(r"^\[(\d)\] member of v3 with 3 workers$", out_a, re.MULTILINE)) == ["0", "1"]
    lines = events(err_a)
    assert "hosts: 127.0.0.1:2,127.0.0.3:1 (added 127.0.0.3; removed 127.0.0.2)" in lines, err_a
    assert f"cluster v2: 3 -> 2 workers (left {evicted})" in lines
    # --elastic replaces the evicted worker in the slot of the new host.
    assert f"placed joiner {replacement} (target 3 workers)" in lines
    assert f"cluster v3: 2 -> 3 workers (admitted {replacement})" in lines
    assert f"started joiner [3] {replacement}" in events(err_c)
    assert "[3] admitted at v3 as rank 2 of 3" in out_c.splitlines()
    # .2 has nothing left to run: it ends with the job (not after --timeout,
    # 120 s by default), which it learns from the config service.
    for err in (err_a, err_b, err_c):
        assert events(err)[-1] == "all 3 members of cluster v3 finished", err
    assert "lost the config service" not in err_b
    # The other launchers describe the changes from the difference.
    assert f"cluster v2: 3 -> 2 workers (left {evicted})" in events(err_b)
    assert f"cluster v3: 2 -> 3 workers (joined {replacement})" in events(err_c)


def test_bad_discovery_output_stops_the_launcher(tmp_path):
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho 127.0.0.1:2\necho 127.0.0.1:many\n")
    script.chmod(0o755)
    res = subprocess.run(
        launcher("-np", "1", "--elastic", "--host-discovery-script", str(script), "--config-server", "127.0.0.1:1",
                 sys.executable, FAKE, "grow", "1"),
        cwd=REPO_ROOT, env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 2
    assert (
        f"--host-discovery-script {script}: line 2 '127.0.0.1:many': slots must be a whole number >= 1, got 'many'"
        in res.stderr
    )


# ------------------------------------------- two hosts as two namespaces

HOST_A = "10.216.0.1"  # a /24 that no other test uses
HOST_B = "10.216.0.2"


def run_on_two_hosts(two, launcher_args: list[str], mode: str, arg: str, job_id: str) -> dict[str, tuple[str, str]]:
    """One launcher per namespace (B names itself with --self); both must exit 0."""
    env = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=job_id)
    procs = {
        host: subprocess.Popen(
            [*two.exec_prefix(i), *launcher(*launcher_args, *extra, sys.executable, FAKE, mode, arg)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i, (host, extra) in enumerate([(HOST_A, []), (HOST_B, ["--self", HOST_B])])
    }
    outputs = {}
    try:
        for host, proc in procs.items():
            outputs[host] = proc.communicate(timeout=60)
    finally:
        for proc in procs.values():
            proc.kill()
    for host, proc in procs.items():
        assert proc.returncode == 0, f"{host}: {outputs[host]}"
    return outputs


def test_joiners_are_started_by_the_launcher_of_their_host(request):
    """Host A serves. Growing: A's two slots are taken, so A places the joiner
    on B and B's launcher starts it. Crash on B: B's launcher reports it lost
    and starts the replacement A placed there, on a port not used before."""
    two = make_two_hosts(request, HOST_A.rsplit(".", 1)[0], "kfe")
    common = ["--elastic", "--config-server", f"{HOST_A}:7070", "--timeout", "5"]

    grow = run_on_two_hosts(two, ["-np", "2", "--max-np", "3", "-H", f"{HOST_A}:2,{HOST_B}:1", *common],
                            "grow", "3", "netns-grow")
    (out_a, err_a), (out_b, err_b) = grow[HOST_A], grow[HOST_B]
    joiner = f"{HOST_B}:10000"
    assert f"started joiner [2] {joiner}" in events(err_b)
    assert "started joiner" not in err_a
    assert f"[2] joiner {joiner} v0 elastic=True" in out_b.splitlines()
    assert "[2] admitted at v2 as rank 2 of 3" in out_b.splitlines()
    assert f"cluster v2: 2 -> 3 workers (admitted {joiner})" in events(err_a)
    assert f"cluster v2: 2 -> 3 workers (joined {joiner})" in events(err_b)
    assert sorted(re.findall(r"^\[(\d)\] saw 3 workers at v2$", out_a, re.MULTILINE)) == ["0", "1"]

    crash = run_on_two_hosts(two, ["-np", "3", "-H", f"{HOST_A}:2,{HOST_B}:2", *common],
                             "crash", "2", "netns-crash")
    (out_a, err_a), (out_b, err_b) = crash[HOST_A], crash[HOST_B]
    crashed, replacement = f"{HOST_B}:10000", f"{HOST_B}:10001"
    assert f"[2] member {crashed} v1 elastic=True" in out_b.splitlines()
    assert f"worker [2] {crashed} killed by signal SIGKILL" in err_b
    for err in (err_a, err_b):
        assert f"cluster v2: 3 -> 2 workers (lost {crashed}: killed by SIGKILL)" in events(err), err
    assert f"started joiner [3] {replacement}" in events(err_b)
    assert f"cluster v3: 2 -> 3 workers (admitted {replacement})" in events(err_a)
    assert "[3] admitted at v3 as rank 2 of 3" in out_b.splitlines()
    assert sorted(re.findall(r"^\[(\d)\] saw 3 workers at v3$", out_a, re.MULTILINE)) == ["0", "1"]


def test_job_ends_when_the_members_of_every_host_finished(request):
    """Host A's member finishes first: A keeps serving the config service
    (B's member still uses it) until B's member finished too; then both
    launchers end at once, without waiting for a lost config service. Then
    the other way round: B, with nothing left to run, waits for A's member."""
    two = make_two_hosts(request, HOST_A.rsplit(".", 1)[0], "kff")
    member = {HOST_A: f"{HOST_A}:10000", HOST_B: f"{HOST_B}:10000"}
    for first, last in ((HOST_A, HOST_B), (HOST_B, HOST_A)):
        rank_first, rank_last = (0, 1) if first == HOST_A else (1, 0)
        start = time.monotonic()
        outputs = run_on_two_hosts(
            two, ["-np", "2", "-H", f"{HOST_A}:1,{HOST_B}:1", "--elastic", "--config-server", f"{HOST_A}:7070",
                  "--timeout", "600"], "finish-apart", f"{rank_first}:1", f"netns-finish-{rank_first}")
        # 1 s of work; a wait for a lost service would cost --timeout 600 s:
        # 120 s tells them apart on any host (a hang bound, not a race).
        assert time.monotonic() - start < 120
        out_last = outputs[last][0]
        assert f"[{rank_last}] saw {member[first]} finished at v1" in out_last.splitlines()
        assert (
            f"no worker left on {first}; waiting for 1 member elsewhere to finish: {member[last]}"
            in events(outputs[first][1])
        ), outputs[first][1]
        for _, err in outputs.values():
            assert events(err)[-1] == "all 2 members of cluster v1 finished", err
            assert "lost the config service" not in err


FORKS_WHILE_POLLING = """
    import subprocess, sys, threading
    from kungfu_tf.run.launch.grpc_fork_safety import disable_grpc_fork_handlers
    if sys.argv[1] == "disabled":
        disable_grpc_fork_handlers()
    from kungfu_tf.run.control.config_server import ConfigClient, ConfigServer

    server = ConfigServer(secret="ab" * 32, elastic=True).start()
    client = ConfigClient(server.address, secret="ab" * 32)
    state = client.get_job_state()

    def poll():
        while True:
            client.wait_job_state(state.state_version + 1, 0.01)

    threading.Thread(target=poll, daemon=True).start()
    # As the launcher starts joiners: a preexec_fn while gRPC threads run.
    failed = sum(subprocess.run(["true"], preexec_fn=lambda: None, capture_output=True).returncode != 0
                 for _ in range(100))
    print("failed forks", failed)
"""


def test_forks_while_grpc_polls_do_not_abort():
    """Before grpc_fork_safety, gRPC's fork handlers killed about 1 child in 6 with SIGABRT."""
    script = textwrap.dedent(FORKS_WHILE_POLLING)
    res = subprocess.run([sys.executable, "-c", script, "disabled"], cwd=REPO_ROOT, env=worker_env(),
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["failed", "forks", "0"], res.stderr
