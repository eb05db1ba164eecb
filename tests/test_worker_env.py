"""Start-up checks of the launcher's options and of the ``KUNGFU_*`` variables.

A malformed value must stop the launcher or the worker before anything runs,
with an error naming the option or variable and its value.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO_ROOT, worker_env

from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.worker_env.worker_env import (
    MAX_TIMEOUT_SECONDS,
    WorkerEnvError,
    read_worker_env,
)

SECRET = "0123456789abcdef" * 4
TWO_PEERS = {"KUNGFU_PEERS": "127.0.0.1:10001,127.0.0.1:10002", "KUNGFU_JOB_SECRET": SECRET}


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1.5", str(MAX_TIMEOUT_SECONDS + 1), "10000000000"])
def test_launcher_rejects_bad_timeout(capsys, value):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["-np", "1", f"--timeout={value}", "prog"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and value in err


def test_launcher_accepts_the_largest_timeout():
    assert parse_args(["-np", "1", "--timeout", str(MAX_TIMEOUT_SECONDS), "prog"]).timeout == MAX_TIMEOUT_SECONDS


def test_well_formed_env_is_read():
    env = read_worker_env({**TWO_PEERS, "KUNGFU_SELF": "127.0.0.1:10002",
                           "KUNGFU_CLUSTER_VERSION": "4294967295", "KUNGFU_TIMEOUT": "2.5"})
    assert (env.rank, env.size, env.cluster_version, env.timeout_seconds) == (1, 2, 2**32 - 1, 2.5)
    assert SECRET not in repr(env)


def test_no_launcher_is_a_one_worker_cluster():
    env = read_worker_env({})
    assert (env.rank, env.size, env.local_peers) == (0, 1, [""])


@pytest.mark.parametrize(
    "variable, value",
    [
        ("KUNGFU_TIMEOUT", "nan"),
        ("KUNGFU_TIMEOUT", "inf"),
        ("KUNGFU_TIMEOUT", "0"),
        ("KUNGFU_TIMEOUT", "-3"),
        ("KUNGFU_TIMEOUT", "1e10"),  # 1e19 ns: past int64
        ("KUNGFU_TIMEOUT", "soon"),
        ("KUNGFU_CLUSTER_VERSION", "abc"),
        ("KUNGFU_CLUSTER_VERSION", "-1"),
        ("KUNGFU_CLUSTER_VERSION", "1.0"),
        ("KUNGFU_CLUSTER_VERSION", "4294967296"),
        ("KUNGFU_CLUSTER_VERSION", " 7"),
        ("KUNGFU_SELF", "127.0.0.1:10003"),
        ("KUNGFU_SELF", "nonsense"),
        ("KUNGFU_DETACHED_NICE", "-5"),
        ("KUNGFU_DETACHED_NICE", "20"),
        ("KUNGFU_DETACHED_NICE", "low"),
        ("KUNGFU_SLOT_REPLICAS", "yes"),
    ],
)
def test_malformed_variable_is_named_with_its_value(variable, value):
    environ = {**TWO_PEERS, "KUNGFU_SELF": "127.0.0.1:10001", variable: value}
    with pytest.raises(WorkerEnvError) as err:
        read_worker_env(environ)
    assert variable in str(err.value) and repr(value) in str(err.value)


@pytest.mark.parametrize("secret", ["Z", "ab" * 31, "g" * 64, "ab" * 33])
def test_malformed_secret_is_rejected_without_printing_it(secret):
    with pytest.raises(WorkerEnvError, match="KUNGFU_JOB_SECRET") as err:
        read_worker_env({**TWO_PEERS, "KUNGFU_SELF": "127.0.0.1:10001", "KUNGFU_JOB_SECRET": secret})
    assert secret not in str(err.value)


def test_missing_secret_is_rejected_for_several_workers():
    with pytest.raises(WorkerEnvError, match="KUNGFU_JOB_SECRET is not set"):
        read_worker_env({"KUNGFU_PEERS": TWO_PEERS["KUNGFU_PEERS"], "KUNGFU_SELF": "127.0.0.1:10001"})


@pytest.mark.parametrize(
    "variable, value",
    [("KUNGFU_CLUSTER_VERSION", "abc"), ("KUNGFU_TIMEOUT", "nan"), ("KUNGFU_SELF", "127.0.0.1:1")],
)
def test_worker_stops_at_start_up(variable, value):
    """A worker whose environment is malformed fails at its first use of the
    runtime, naming the variable; before, ``abc`` silently became version 0."""
    script = "import kungfu_tf; print('rank', kungfu_tf.rank(), 'size', kungfu_tf.size())"
    env = worker_env(KUNGFU_PEERS="127.0.0.1:10001", KUNGFU_SELF="127.0.0.1:10001", KUNGFU_JOB_SECRET=SECRET)
    env[variable] = value
    res = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode != 0, res.stdout
    assert f"{variable}" in res.stderr and repr(value) in res.stderr, res.stderr[-2000:]
    assert "WorkerEnvError" in res.stderr


def test_graph_mode_rank_names_a_missing_self(monkeypatch):
    """v1 graph mode reads rank/size from the environment (no eager op can run):
    a KUNGFU_SELF missing from KUNGFU_PEERS is named, not a bare list.index error."""
    from kungfu_tf.ops import config

    for k, v in {**TWO_PEERS, "KUNGFU_SELF": "127.0.0.1:10003"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(WorkerEnvError, match=r"KUNGFU_SELF='127.0.0.1:10003' is not in KUNGFU_PEERS"):
        config._from_env(config.rank)
    monkeypatch.setenv("KUNGFU_SELF", "127.0.0.1:10002")
    assert [config._from_env(op) for op in (config.rank, config.cluster_size, config.local_rank, config.local_size)] == [1, 2, 1, 2]


# ------------------------------------------------------- elastic variables

ELASTIC = {**TWO_PEERS, "KUNGFU_SELF": "127.0.0.1:10001", "KUNGFU_CLUSTER_VERSION": "1",
           "KUNGFU_ELASTIC": "1", "KUNGFU_CONFIG_SERVER": "127.0.0.1:9999"}
JOINER = {"KUNGFU_PEERS": "127.0.0.1:10005", "KUNGFU_SELF": "127.0.0.1:10005", "KUNGFU_JOB_SECRET": SECRET,
          "KUNGFU_CLUSTER_VERSION": "0", "KUNGFU_ELASTIC": "1", "KUNGFU_JOINER": "1",
          "KUNGFU_CONFIG_SERVER": "10.0.0.1:9999"}


def test_elastic_variables_are_read():
    member = read_worker_env(ELASTIC)
    assert (member.config_server, member.elastic, member.joiner) == ("127.0.0.1:9999", True, False)
    joiner = read_worker_env(JOINER)
    assert (joiner.config_server, joiner.elastic, joiner.joiner, joiner.size) == ("10.0.0.1:9999", True, True, 1)
    plain = read_worker_env({**TWO_PEERS, "KUNGFU_SELF": "127.0.0.1:10001"})
    assert (plain.config_server, plain.elastic, plain.joiner) == (None, False, False)


@pytest.mark.parametrize(
    "base, variable, value, message",
    [
        (ELASTIC, "KUNGFU_ELASTIC", "yes", "KUNGFU_ELASTIC must be 0 or 1, got 'yes'"),
        (JOINER, "KUNGFU_JOINER", "2", "KUNGFU_JOINER must be 0 or 1, got '2'"),
        (ELASTIC, "KUNGFU_CONFIG_SERVER", "nohost", "KUNGFU_CONFIG_SERVER: bad peer address 'nohost'"),
        (ELASTIC, "KUNGFU_CONFIG_SERVER", "h:0", "KUNGFU_CONFIG_SERVER: bad peer address 'h:0'"),
        (ELASTIC, "KUNGFU_CONFIG_SERVER", "", "KUNGFU_ELASTIC=1 needs KUNGFU_CONFIG_SERVER"),
        (JOINER, "KUNGFU_ELASTIC", "0", "KUNGFU_JOINER=1 is only valid in an elastic job (KUNGFU_ELASTIC=1), got KUNGFU_ELASTIC='0'"),
        (JOINER, "KUNGFU_PEERS", "127.0.0.1:10005,127.0.0.1:10006",
         "a joiner starts as a cluster of itself, so KUNGFU_PEERS must be KUNGFU_SELF='127.0.0.1:10005'"),
        (JOINER, "KUNGFU_CLUSTER_VERSION", "3", "a joiner starts at KUNGFU_CLUSTER_VERSION=0, got 3"),
    ],
)
def test_malformed_elastic_variable_is_named(base, variable, value, message):
    with pytest.raises(WorkerEnvError) as err:
        read_worker_env({**base, variable: value})
    assert message in str(err.value)


def test_launcher_exports_the_elastic_variables():
    from kungfu_tf.run.worker_env.placement import Peer
    from kungfu_tf.run.worker_env.worker_env import build_worker_env

    me = Peer(5, "127.0.0.1", 10005)
    common = {"topology": "STAR", "timeout": 30, "secret": SECRET, "job_id": "j"}
    joiner = build_worker_env({"KUNGFU_ELASTIC": "stale"}, me, [me], **common,
                              config_server="127.0.0.1:9999", joiner=True)
    assert read_worker_env(joiner).joiner
    assert {k: joiner[k] for k in ("KUNGFU_ELASTIC", "KUNGFU_JOINER", "KUNGFU_CLUSTER_VERSION", "KUNGFU_PEERS",
                                   "KUNGFU_RANK", "KUNGFU_SIZE")} == {
        "KUNGFU_ELASTIC": "1", "KUNGFU_JOINER": "1", "KUNGFU_CLUSTER_VERSION": "0", "KUNGFU_PEERS": "127.0.0.1:10005",
        "KUNGFU_RANK": "0", "KUNGFU_SIZE": "1"}
    # A plain job started from inside an elastic worker does not inherit its role.
    plain = build_worker_env(joiner, me, [me], **common)
    assert not {"KUNGFU_ELASTIC", "KUNGFU_JOINER", "KUNGFU_CONFIG_SERVER"} & plain.keys()
