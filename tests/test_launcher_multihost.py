"""Multi-host behaviour of ``kungfu-run``.

The end-to-end test builds two network namespaces joined by a veth pair
(10.213.0.1 <-> 10.213.0.2; no traffic leaves them) and runs one launcher
in each, as a user would on two machines.  Nothing here imports TensorFlow.
"""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from netns import make_two_hosts

REPO_ROOT = Path(__file__).resolve().parents[1]

from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.worker_env.job_id import resolve_job_id
from kungfu_tf.run.worker_env.job_secret import resolve_job_secret
from kungfu_tf.run.worker_env.placement import (
    Peer,
    assign_range_ports,
    hosts_in_use,
    parse_hosts,
    place_workers,
)

HOST_A = "10.213.0.1"
HOST_B = "10.213.0.2"
HOSTS = f"{HOST_A}:2,{HOST_B}:2"
SECRET = "0123456789abcdef" * 4
JOB_ID = "netns-run-1"


def launcher_env(**extra: str) -> dict[str, str]:
    """The test's environment without stray KUNGFU_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p
    )
    env.update(extra)
    return env


# ------------------------------------------------------------ pure unit tests


def test_every_host_derives_the_same_peer_list():
    placements = place_workers(parse_hosts(HOSTS), 4)
    peers = assign_range_ports(placements, 10000, 11000)
    assert peers == [
        Peer(0, HOST_A, 10000),
        Peer(1, HOST_A, 10001),
        Peer(2, HOST_B, 10000),
        Peer(3, HOST_B, 10001),
    ]
    # Nothing machine-dependent goes in: recomputing gives the same list.
    again = assign_range_ports(place_workers(parse_hosts(HOSTS), 4), 10000, 11000)
    assert again == peers
    assert hosts_in_use(placements) == [HOST_A, HOST_B]


def test_unused_hosts_are_not_in_use():
    placements = place_workers(parse_hosts("a:4,b:4"), 3)
    assert hosts_in_use(placements) == ["a"]


def test_port_range_must_cover_the_busiest_host():
    placements = place_workers(parse_hosts("a:1,b:3"), 4)
    with pytest.raises(LaunchError, match="host b runs more than 2 workers"):
        assign_range_ports(placements, 10000, 10001)


def test_multi_host_secret_must_be_exported():
    with pytest.raises(LaunchError, match="same KUNGFU_JOB_SECRET exported"):
        resolve_job_secret({}, multi_host=True)
    assert resolve_job_secret({"KUNGFU_JOB_SECRET": SECRET}, multi_host=True) == SECRET
    with pytest.raises(LaunchError, match="64 hexadecimal"):
        resolve_job_secret({"KUNGFU_JOB_SECRET": "xyz"}, multi_host=False)
    generated = {resolve_job_secret({}, multi_host=False) for _ in range(2)}
    assert len(generated) == 2
    assert all(re.fullmatch(r"[0-9a-f]{64}", s) for s in generated)


def test_multi_host_job_id_must_be_exported():
    with pytest.raises(
        LaunchError,
        match="same KUNGFU_JOB_ID exported on every host, a new one for each run",
    ):
        resolve_job_id({}, multi_host=True)
    assert resolve_job_id({"KUNGFU_JOB_ID": JOB_ID}, multi_host=True) == JOB_ID
    for bad in ("x" * 129, "caf\u00e9", "a\nb"):
        with pytest.raises(
            LaunchError, match="KUNGFU_JOB_ID must be 1 to 128 printable ASCII"
        ):
            resolve_job_id({"KUNGFU_JOB_ID": bad}, multi_host=False)
    assert resolve_job_id({"KUNGFU_JOB_ID": "~" * 128}, multi_host=True) == "~" * 128
    generated = {resolve_job_id({}, multi_host=False) for _ in range(2)}
    assert len(generated) == 2
    assert all(re.fullmatch(r"[0-9a-f]{32}", s) for s in generated)


def test_cli_multi_host_without_secret_fails():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kungfu_tf.run",
            "-np",
            "2",
            "-H",
            "127.0.0.1:1,192.0.2.123:1",
            "--self",
            "127.0.0.1",
            "x.py",
        ],
        check=False,
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 2
    assert "KUNGFU_JOB_SECRET" in res.stderr


def test_host_without_workers_runs_nothing():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "kungfu_tf.run",
            "-np",
            "1",
            "-H",
            "192.0.2.123:1,127.0.0.1:1",
            "--self",
            "127.0.0.1",
            "no-such-prog",
        ],
        check=False,
        env=launcher_env(),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    assert "no workers are placed on 127.0.0.1" in res.stderr


# ------------------------------------------------ two hosts as two namespaces


@pytest.fixture
def two_hosts(request) -> tuple[str, str]:
    """Two network namespaces with HOST_A and HOST_B on a veth pair."""
    return make_two_hosts(request, HOST_A.rsplit(".", 1)[0], "kft").namespaces


PEER_SCRIPT = """
    import os, socket, sys, time

    rank = int(os.environ["KUNGFU_RANK"])
    peers = os.environ["KUNGFU_PEERS"].split(",")
    if peers != sys.argv[1].split(","):
        print("unexpected peers", peers)
        sys.exit(10)
    if os.environ["KUNGFU_SELF"] != peers[rank]:
        print("unexpected self", os.environ["KUNGFU_SELF"])
        sys.exit(11)
    print("secret", os.environ["KUNGFU_JOB_SECRET"])
    print("job", os.environ["KUNGFU_JOB_ID"])

    if rank == 0:
        host, port = peers[0].rsplit(":", 1)
        server = socket.create_server((host, int(port)))
        server.settimeout(30)
        conn, addr = server.accept()
        with conn:
            msg = conn.makefile("rb").readline().decode().strip()
            conn.sendall(b"ack from rank 0\\n")
        print(f"got {msg!r} from {addr[0]}")
    elif rank == 2:
        host, port = peers[0].rsplit(":", 1)
        deadline = time.monotonic() + 30
        while True:
            try:
                conn = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # rank 0 may not be listening yet
        with conn:
            conn.sendall(b"hello from rank 2\\n")
            reply = conn.makefile("rb").readline().decode().strip()
        print(f"got {reply!r}")
"""


def test_two_hosts_in_network_namespaces(two_hosts, tmp_path):
    script = tmp_path / "peer.py"
    script.write_text(textwrap.dedent(PEER_SCRIPT))
    expected = f"{HOST_A}:10000,{HOST_A}:10001,{HOST_B}:10000,{HOST_B}:10001"
    env = launcher_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=JOB_ID)
    base = [sys.executable, "-m", "kungfu_tf.run", "-np", "4", "-H", HOSTS]
    # Host A finds itself among the -H hosts; host B is told explicitly.
    commands = {
        HOST_A: ["ip", "netns", "exec", two_hosts[0], *base, str(script), expected],
        HOST_B: [
            "ip",
            "netns",
            "exec",
            two_hosts[1],
            *base,
            "--self",
            HOST_B,
            str(script),
            expected,
        ],
    }
    procs = {
        host: subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for host, cmd in commands.items()
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
    out_a, out_b = outputs[HOST_A][0], outputs[HOST_B][0]
    # Each launcher starts only its own host's workers.
    assert {int(m) for m in re.findall(r"^\[(\d+)\]", out_a, re.MULTILINE)} == {0, 1}
    assert {int(m) for m in re.findall(r"^\[(\d+)\]", out_b, re.MULTILINE)} == {2, 3}
    secrets = re.findall(r"^\[\d+\] secret (\w+)$", out_a + out_b, re.MULTILINE)
    assert secrets == [SECRET] * 4
    job_ids = re.findall(r"^\[\d+\] job (\S+)$", out_a + out_b, re.MULTILINE)
    assert job_ids == [JOB_ID] * 4
    assert f"[0] got 'hello from rank 2' from {HOST_B}" in out_a.splitlines()
    assert "[2] got 'ack from rank 0'" in out_b.splitlines()
