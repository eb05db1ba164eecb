"""Tests of the ``kungfu-run`` launcher on a single host.

Workers are tiny Python scripts written to ``tmp_path``; the launcher is
run as ``python -m kungfu_tf.run`` in a subprocess, exactly as users run
it.  Nothing here imports TensorFlow.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

from benchmarks.harness.port_block import free_port_block
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan import local_host
from kungfu_tf.run.plan.cli import parse_args, program_command
from kungfu_tf.run.plan.ports import parse_port_range
from kungfu_tf.run.plan.topology import normalize_topology
from kungfu_tf.run.providers.worker_process import describe_exit, exit_status
from kungfu_tf.run.worker_env.placement import (
    HostSlots,
    Placement,
    parse_hosts,
    place_workers,
)

LINE_RE = re.compile(r"^\[(\d+)\] (.*)$")


def launcher_env(**extra: str) -> dict[str, str]:
    """The test's environment without stray KUNGFU_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    env.update(extra)
    return env


def launcher_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kungfu_tf.run", *args]

def start_launcher(*args: str) -> subprocess.Popen:
    """kungfu-run started in the background with pipes, for the signal tests."""
    return subprocess.Popen(
        launcher_cmd(*args), env=launcher_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )



def run_launcher(*args: str, timeout: float = 60, **env: str):
    return subprocess.run(
        launcher_cmd(*args),
        check=False,
        env=launcher_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def prefixed_lines(text: str) -> list[tuple[int, str]]:
    """Split launcher output into (rank, line); every line must be prefixed."""
    result = []
    for line in text.splitlines():
        m = LINE_RE.match(line)
        assert m, f"unprefixed output line: {line!r}"
        result.append((int(m.group(1)), m.group(2)))
    return result


def pid_alive(pid: int) -> bool:
    """True if ``pid`` runs and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_for_files(paths: list[Path], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text().strip() for p in paths):
        assert time.monotonic() < deadline, f"workers did not start: {paths}"
        time.sleep(0.05)


def wait_dead(pids: list[int], timeout: float = 5) -> list[int]:
    """Return the pids still alive after ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if pid_alive(p)]


ENV_SCRIPT = """
    import json, os
    keys = ["KUNGFU_SELF", "KUNGFU_PEERS", "KUNGFU_CLUSTER_VERSION",
            "KUNGFU_TOPOLOGY", "KUNGFU_TIMEOUT", "KUNGFU_JOB_SECRET",
            "KUNGFU_JOB_ID", "KUNGFU_RANK", "KUNGFU_SIZE", "PYTHONUNBUFFERED"]
    print(json.dumps({k: os.environ.get(k) for k in keys}))
"""


def collect_envs(stdout: str) -> dict[int, dict]:
    return {rank: json.loads(line) for rank, line in prefixed_lines(stdout)}


# ---------------------------------------------------------------- environment


@pytest.mark.parametrize("np", [1, 2, 3, 4])
def test_worker_env_single_host(tmp_path, np):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    res = run_launcher("-np", str(np), str(script))
    assert res.returncode == 0, res.stderr
    envs = collect_envs(res.stdout)
    assert sorted(envs) == list(range(np))

    peers = envs[0]["KUNGFU_PEERS"].split(",")
    assert len(peers) == np
    assert all(p.startswith("127.0.0.1:") for p in peers)
    assert len({p.rsplit(":", 1)[1] for p in peers}) == np, "ports not distinct"
    secrets = {e["KUNGFU_JOB_SECRET"] for e in envs.values()}
    assert len(secrets) == 1
    assert re.fullmatch(r"[0-9a-f]{64}", secrets.pop())
    job_ids = {e["KUNGFU_JOB_ID"] for e in envs.values()}
    assert len(job_ids) == 1
    assert re.fullmatch(r"[0-9a-f]{32}", job_ids.pop())
    for rank, env in envs.items():
        assert env["KUNGFU_PEERS"] == envs[0]["KUNGFU_PEERS"]
        assert env["KUNGFU_SELF"] == peers[rank]
        assert env["KUNGFU_RANK"] == str(rank)
        assert env["KUNGFU_SIZE"] == str(np)
        assert env["KUNGFU_CLUSTER_VERSION"] == "0"
        assert env["KUNGFU_TOPOLOGY"] == "AUTO"
        assert env["KUNGFU_TIMEOUT"] == "120"
        assert env["PYTHONUNBUFFERED"] == "1"


def test_options_and_inherited_secret_reach_workers(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    secret = "ab" * 32
    res = run_launcher(
        "-np",
        "2",
        "--topology",
        "binary_tree_star",
        "--timeout",
        "7",
        str(script),
        KUNGFU_JOB_SECRET=secret,
        KUNGFU_JOB_ID="slurm-4711",
    )
    assert res.returncode == 0, res.stderr
    envs = collect_envs(res.stdout)
    assert [e["KUNGFU_TOPOLOGY"] for e in envs.values()] == ["BINARY_TREE_STAR"] * 2
    assert [e["KUNGFU_TIMEOUT"] for e in envs.values()] == ["7"] * 2
    assert [e["KUNGFU_JOB_SECRET"] for e in envs.values()] == [secret] * 2
    assert [e["KUNGFU_JOB_ID"] for e in envs.values()] == ["slurm-4711"] * 2


def test_malformed_job_id_is_refused(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    res = run_launcher("-np", "2", str(script), KUNGFU_JOB_ID="a\tb")
    assert res.returncode == 2
    assert "KUNGFU_JOB_ID must be 1 to 128 printable ASCII characters, got 'a\\tb'" in res.stderr


def test_concurrent_jobs_get_different_free_ports(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    procs = [
        subprocess.Popen(
            launcher_cmd("-np", "4", str(script)),
            env=launcher_env(),
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    ports = [set(collect_envs(o)[0]["KUNGFU_PEERS"].split(",")) for o in outs]
    assert not ports[0] & ports[1]
    # Each run gets its own id, so their workers can never join each other.
    assert collect_envs(outs[0])[0]["KUNGFU_JOB_ID"] != collect_envs(outs[1])[0]["KUNGFU_JOB_ID"]


def test_explicit_port_range_is_used_in_order(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    base = free_port_block(11)
    res = run_launcher("-np", "3", "--port-range", f"{base}-{base + 10}", str(script))
    assert res.returncode == 0, res.stderr
    envs = collect_envs(res.stdout)
    expected = [f"127.0.0.1:{base + j}" for j in range(3)]
    assert envs[0]["KUNGFU_PEERS"] == ",".join(expected)


def test_explicit_port_in_use_is_named(tmp_path):
    script = write_script(tmp_path, "env.py", ENV_SCRIPT)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        res = run_launcher(
            "-np", "2", "--port-range", f"{port}-{port + 5}", str(script)
        )
    assert res.returncode == 2
    assert f"port {port} " in res.stderr
    assert "in use" in res.stderr
    assert res.stdout == ""


def test_port_range_too_small_for_host(tmp_path):
    res = run_launcher("-np", "3", "--port-range", "20000-20001", "x.py")
    assert res.returncode == 2
    assert "port range 20000-20001 is too small" in res.stderr


# --------------------------------------------------------------------- output


def test_stdout_and_stderr_are_prefixed(tmp_path):
    script = write_script(
        tmp_path,
        "out.py",
        """
        import os, sys
        r = os.environ["KUNGFU_RANK"]
        print(f"out {r}")
        print(f"err {r}", file=sys.stderr)
        sys.stdout.write(f"no newline {r}")
    """,
    )
    res = run_launcher("-np", "3", str(script))
    assert res.returncode == 0, res.stderr
    out = prefixed_lines(res.stdout)
    assert sorted(out) == sorted(
        [(r, f"out {r}") for r in range(3)] + [(r, f"no newline {r}") for r in range(3)]
    )
    assert sorted(prefixed_lines(res.stderr)) == [(r, f"err {r}") for r in range(3)]


def test_long_lines_from_many_ranks_never_interleave(tmp_path):
    script = write_script(
        tmp_path,
        "spam.py",
        """
        import os, sys
        r = os.environ["KUNGFU_RANK"]
        for i in range(150):
            stream = sys.stdout if i % 2 else sys.stderr
            stream.write(f"{r} " + r * 3000 + "\\n")
    """,
    )
    res = run_launcher("-np", "4", str(script))
    assert res.returncode == 0, res.stderr
    lines = prefixed_lines(res.stdout) + prefixed_lines(res.stderr)
    assert len(lines) == 4 * 150
    for rank, text in lines:
        assert text == f"{rank} " + str(rank) * 3000


LOG_SCRIPT = """
    import os, sys
    r = os.environ["KUNGFU_RANK"]
    print(f"hello {r}")
    print(f"warn {r}", file=sys.stderr)
"""


def test_logdir_gets_raw_output_per_rank(tmp_path):
    script = write_script(tmp_path, "log.py", LOG_SCRIPT)
    logdir = tmp_path / "logs" / "nested"
    res = run_launcher("-np", "2", "--logdir", str(logdir), str(script))
    assert res.returncode == 0, res.stderr
    assert "[1] hello 1" in res.stdout.splitlines()
    assert sorted(p.name for p in logdir.iterdir()) == ["rank-0.log", "rank-1.log"]
    for r in range(2):
        lines = (logdir / f"rank-{r}.log").read_text().splitlines()
        assert sorted(lines) == sorted([f"hello {r}", f"warn {r}"])


def test_quiet_suppresses_echo_but_keeps_logs(tmp_path):
    script = write_script(tmp_path, "log.py", LOG_SCRIPT)
    res = run_launcher("-np", "2", "-q", "--logdir", str(tmp_path / "l"), str(script))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "" and res.stderr == ""
    assert "hello 1" in (tmp_path / "l" / "rank-1.log").read_text()


def test_non_python_program_and_its_arguments(tmp_path):
    res = run_launcher("-np", "2", "sh", "-c", 'echo "sh $KUNGFU_RANK $0"', "-q")
    assert res.returncode == 0, res.stderr
    assert sorted(prefixed_lines(res.stdout)) == [(0, "sh 0 -q"), (1, "sh 1 -q")]


def test_missing_program_is_reported():
    res = run_launcher("-np", "2", "./no-such-program-here")
    assert res.returncode == 127
    assert "cannot start './no-such-program-here'" in res.stderr


def test_unwritable_log_file_is_reported_as_such(tmp_path):
    """A --logdir whose rank file cannot be opened (here: it is a directory,
    which stops root too) is a --logdir error, not "cannot start 'sh'", and
    no worker starts."""
    logdir = tmp_path / "logs"
    (logdir / "rank-1.log").mkdir(parents=True)
    marker = tmp_path / "started"
    res = run_launcher("-np", "2", "--logdir", str(logdir), "sh", "-c", f"touch {marker}-$KUNGFU_RANK")
    assert res.returncode == 2, res.stderr
    assert f"cannot write log file {logdir / 'rank-1.log'} in --logdir {logdir}: Is a directory" in res.stderr
    assert "cannot start" not in res.stderr
    assert not list(tmp_path.glob("started-*")), "a worker started"


def test_logdir_under_a_file_is_reported(tmp_path):
    (tmp_path / "file").write_text("")
    res = run_launcher("-np", "1", "--logdir", str(tmp_path / "file" / "logs"), "true")
    assert res.returncode == 2
    assert f"cannot create --logdir {tmp_path / 'file' / 'logs'}: Not a directory" in res.stderr


# ------------------------------------------------------------------- failures

SLEEPER = """
    import os, pathlib, signal, sys, time
    rank = int(os.environ["KUNGFU_RANK"])
    size = int(os.environ["KUNGFU_SIZE"])
    out = pathlib.Path(sys.argv[1])
    mode = sys.argv[2]

    def on_signal(signum, frame):
        (out / f"sig-{rank}").write_text(signal.Signals(signum).name)
        sys.exit(1)

    if mode == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    (out / f"pid-{rank}").write_text(str(os.getpid()))
    if rank == 1 and mode in ("fail", "selfkill"):
        # Fail only once everybody runs, so the test sees real survivors.
        while len(list(out.glob("pid-*"))) < size:
            time.sleep(0.02)
        if mode == "selfkill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(3)
    time.sleep(600)  # longer than any test waits: only a signal ends it in time
"""


def read_pids(tmp_path: Path, np: int) -> list[int]:
    files = [tmp_path / f"pid-{r}" for r in range(np)]
    wait_for_files(files)
    return [int(f.read_text()) for f in files]


def test_failing_worker_stops_the_job(tmp_path):
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    res = run_launcher("-np", "3", str(script), str(tmp_path), "fail")
    assert res.returncode == 3
    assert re.search(
        r"kungfu-run: rank 1 \(127\.0\.0\.1:\d+\) failed with exit code 3", res.stderr
    ), res.stderr
    # Terminated, not left to their 600 s sleep: the launcher returned within
    # run_launcher's 60 s, and the sig-N files below show what ended them
    # (a clock bound on the launcher raced the host's speed).
    pids = read_pids(tmp_path, 3)
    assert wait_dead(pids, timeout=1) == []
    # The survivors were asked politely first.
    assert (tmp_path / "sig-0").read_text() == "SIGTERM"
    assert (tmp_path / "sig-2").read_text() == "SIGTERM"


def test_worker_killed_by_signal(tmp_path):
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    res = run_launcher("-np", "2", str(script), str(tmp_path), "selfkill")
    assert res.returncode == 128 + signal.SIGKILL
    assert re.search(
        r"rank 1 \(127\.0\.0\.1:\d+\) killed by signal SIGKILL", res.stderr
    )
    assert wait_dead(read_pids(tmp_path, 2), timeout=1) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signal_is_forwarded_to_workers(tmp_path, sig):
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    proc = start_launcher("-np", "3", str(script), str(tmp_path), "sleep")
    try:
        pids = read_pids(tmp_path, 3)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig
    assert f"received {sig.name}" in err
    for r in range(3):
        assert (tmp_path / f"sig-{r}").read_text() == sig.name
    assert wait_dead(pids, timeout=1) == []


def test_workers_ignoring_sigterm_are_killed(tmp_path):
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    proc = start_launcher("-np", "2", str(script), str(tmp_path), "ignore")
    try:
        pids = read_pids(tmp_path, 2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert "sending SIGKILL" in err
    assert wait_dead(pids, timeout=1) == []


def test_workers_die_when_launcher_is_sigkilled(tmp_path):
    script = write_script(tmp_path, "sleeper.py", SLEEPER)
    proc = subprocess.Popen(
        launcher_cmd("-np", "2", str(script), str(tmp_path), "sleep"),
        env=launcher_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    pids: list[int] = []
    try:
        pids = read_pids(tmp_path, 2)
        proc.kill()  # no chance to clean up: PR_SET_PDEATHSIG must do it
        proc.wait(timeout=10)
        survivors = wait_dead(pids, timeout=5)
    finally:
        proc.kill()
        # Do not leave orphans behind if the launcher got this wrong.
        for pid in wait_dead(pids, timeout=0):
            os.kill(pid, signal.SIGKILL)
    assert survivors == []


# ------------------------------------------------------------ pure unit tests


def test_parse_hosts_keeps_order():
    assert parse_hosts("b:2, a:1,c:3") == [
        HostSlots("b", 2),
        HostSlots("a", 1),
        HostSlots("c", 3),
    ]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "must not be empty"),
        ("a", "expected host:slots"),
        ("a:", "expected host:slots"),
        (":2", "expected host:slots"),
        ("a:2,,b:1", "expected host:slots"),
        ("a:x", "slots must be an integer"),
        ("a:0", "slots must be at least 1"),
        ("a:-1", "slots must be at least 1"),
        ("::1:2", "hostname or IPv4"),
        ("a:1,a:2", "listed twice"),
    ],
)
def test_parse_hosts_rejects_bad_syntax(spec, message):
    with pytest.raises(LaunchError, match=message):
        parse_hosts(spec)


def test_place_workers_fills_hosts_in_list_order():
    hosts = [HostSlots("h1", 2), HostSlots("h2", 3)]
    assert place_workers(hosts, 4) == [
        Placement(0, "h1", 0),
        Placement(1, "h1", 1),
        Placement(2, "h2", 0),
        Placement(3, "h2", 1),
    ]
    assert [p.host for p in place_workers(hosts, 1)] == ["h1"]


def test_place_workers_rejects_too_many():
    with pytest.raises(LaunchError, match="-np 6 exceeds the 5 slots"):
        place_workers([HostSlots("h1", 2), HostSlots("h2", 3)], 6)


def test_cli_reports_too_many_workers():
    res = run_launcher("-np", "3", "-H", "127.0.0.1:2", "x.py")
    assert res.returncode == 2
    assert "-np 3 exceeds the 2 slots" in res.stderr


def test_cli_reports_bad_host_syntax():
    res = run_launcher("-np", "1", "-H", "127.0.0.1", "x.py")
    assert res.returncode == 2
    assert "bad -H entry '127.0.0.1'" in res.stderr


@pytest.mark.parametrize("name", ["ring", "Binary_Tree", "STAR", "clique", "auto"])
def test_topology_is_normalised(name):
    assert normalize_topology(name) == name.upper()


def test_bad_topology_is_rejected():
    with pytest.raises(LaunchError, match="unknown topology 'TREE'"):
        normalize_topology("TREE")
    res = run_launcher("-np", "1", "--topology", "mesh", "x.py")
    assert res.returncode == 2
    assert "unknown topology 'mesh'" in res.stderr


@pytest.mark.parametrize("text", ["10", "a-b", "5-4", "0-10", "1-70000"])
def test_bad_port_range(text):
    with pytest.raises(LaunchError, match="bad --port-range"):
        parse_port_range(text)


def test_parse_args_defaults_and_program():
    opts = parse_args(["-np", "2", "train.py", "--epochs", "3", "-q"])
    assert opts.np == 2 and opts.hosts is None and opts.port_range is None
    assert opts.topology == "AUTO" and opts.timeout == 120 and not opts.quiet
    assert opts.command == [sys.executable, "train.py", "--epochs", "3", "-q"]
    assert program_command(["./run.sh", "x"]) == ["./run.sh", "x"]
    assert parse_args(["-np", "1", "--", "prog"]).command == ["prog"]


def test_parse_args_requires_program(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["-np", "2"])
    assert exc.value.code == 2
    assert "missing PROGRAM" in capsys.readouterr().err


def test_self_host_detection(monkeypatch):
    assert local_host.is_local_address("127.0.0.1")
    monkeypatch.setattr(local_host, "is_local_address", lambda h: h == "b")
    assert local_host.choose_self_host(["a", "b", "c"], None) == "b"
    assert local_host.choose_self_host(["a", "b"], "a") == "a"
    with pytest.raises(LaunchError, match="--self z is not one of the hosts"):
        local_host.choose_self_host(["a", "b"], "z")
    with pytest.raises(LaunchError, match="pass --self HOST"):
        local_host.choose_self_host(["a", "c"], None)


def test_exit_descriptions():
    assert describe_exit(3) == "failed with exit code 3"
    assert describe_exit(-9) == "killed by signal SIGKILL"
    assert exit_status(-15) == 143 and exit_status(4) == 4


TF_SCRIPT = """
import tensorflow as tf
print("sum", int(tf.constant(2) + 3), flush=True)
"""


@pytest.mark.parametrize("show", [False, True], ids=["default", "--tf-startup-logs"])
def test_tensorflow_startup_notices_stay_off_the_terminal(tmp_path, show):
    """A real TensorFlow worker: its absl/oneDNN start-up lines reach the --logdir file, not the terminal."""
    script = write_script(tmp_path, "tf_worker.py", TF_SCRIPT)
    env = {k: v for k, v in launcher_env().items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    flags = ["--tf-startup-logs"] if show else []
    res = subprocess.run(launcher_cmd("-np", "1", *flags, "--logdir", str(tmp_path / "l"), sys.executable, str(script)),
                         env=env, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "[0] sum 5" in res.stdout.splitlines()
    log = (tmp_path / "l" / "rank-0.log").read_text()
    assert "oneDNN custom operations" in log  # TensorFlow printed it: the test sees the real thing
    assert ("oneDNN custom operations" in res.stderr) == show, res.stderr
    assert ("absl::InitializeLog" in res.stderr) == show, res.stderr
    # A user's own TF_CPP_MIN_LOG_LEVEL means "I manage TF's logging": nothing is hidden.
    if not show:
        res = subprocess.run(launcher_cmd("-np", "1", sys.executable, str(script)), env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"},
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
        assert res.returncode == 0 and "oneDNN custom operations" in res.stderr, res.stderr


@pytest.mark.parametrize(
    "old, new",
    [
        ("kungfu_tf.run.launcher", "kungfu_tf.run.launch.launcher"),
        ("kungfu_tf.run.config_server", "kungfu_tf.run.control.config_server"),
        ("kungfu_tf.run.job_state", "kungfu_tf.run.control.job_state"),
    ],
)
def test_moved_modules_still_import_from_their_old_paths(old, new):
    """The paths README and installed ``kungfu-run`` scripts name give the moved module, with a warning."""
    code = (
        "import importlib, sys, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        f"try:\n    importlib.import_module({old!r})\n"
        "except DeprecationWarning as e:\n    print('warned:', e)\n"
        "warnings.simplefilter('ignore', DeprecationWarning)\n"
        f"print(importlib.import_module({old!r}) is importlib.import_module({new!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [f"warned: {old} moved to {new}; import it from there", "True"]
