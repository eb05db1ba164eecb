"""mpirun/srun environments -> KUNGFU_* variables (kungfu_tf.run.worker_env.external_launch), no TF.

The environments are fabricated as Open MPI 4.1 and Slurm set them; the
real mpirun launches are in tests/test_external_launch.py. Expected peer
lists are written out by hand, not computed with the module's helpers.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket

import pytest

from kungfu_tf.run.worker_env.external_launch import (
    PORT_WINDOW_FIRST,
    ExternalLaunchError,
    apply_external_launch,
    derived_port_base,
    detect_external_launch,
)
from kungfu_tf.run.worker_env.slurm_hostlist import (
    expand_hostlist,
    expand_tasks_per_node,
)
from kungfu_tf.run.worker_env.worker_env import WorkerEnvError, read_worker_env

TRANSPORTS = "66a1437396f18193-6276e9352810f2e1"
SECRET = "ab" * 32


def ompi_env(rank: int, size: int, local_rank: int | None = None, local_size: int | None = None,
             nodes: int = 1, **extra: str) -> dict[str, str]:
    """What mpirun 4.1 gives rank ``rank`` (one node, by-slot, unless told)."""
    env = {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(size),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank if local_rank is None else local_rank),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(size if local_size is None else local_size),
        "OMPI_MCA_orte_num_nodes": str(nodes),
        "OMPI_MCA_ess_base_jobid": "1197604865",
        "OMPI_MCA_orte_precondition_transports": TRANSPORTS,
    }
    env.update(extra)
    return env


def slurm_env(rank: int, local_rank: int, ntasks: int, nodelist: str, tasks_per_node: str,
              **extra: str) -> dict[str, str]:
    """What srun gives task ``rank`` of step 0 of job 4242."""
    env = {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_LOCALID": str(local_rank),
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "KUNGFU_JOB_SECRET": SECRET,
    }
    env.update(extra)
    return env


# --- Open MPI -----------------------------------------------------------------


def test_open_mpi_one_node_gives_loopback_peers_every_rank_agrees_on():
    launches = [detect_external_launch(ompi_env(r, 3, KUNGFU_PORT_BASE="30000")) for r in range(3)]
    peers = ("127.0.0.1:30000", "127.0.0.1:30001", "127.0.0.1:30002")
    assert [(x.rank, x.self_address, x.peers) for x in launches] == [(r, peers[r], peers) for r in range(3)]
    env = launches[1].worker_env()
    # What kungfu-run would give rank 1, and what the runtime accepts.
    checked = read_worker_env(env)
    assert (checked.rank, checked.size, checked.peers) == (1, 3, peers)
    assert env["KUNGFU_JOB_ID"] == "ompi-1197604865"
    assert (env["KUNGFU_RANK"], env["KUNGFU_SIZE"], env["KUNGFU_CLUSTER_VERSION"]) == ("1", "3", "0")


def test_open_mpi_secret_is_hkdf_of_the_per_job_transports_key():
    secrets = {detect_external_launch(ompi_env(r, 2)).secret for r in range(2)}
    # RFC 5869 with SHA-256: extract (salt = job id), one block of expand (info = label).
    prk = hmac.new(b"ompi-1197604865", TRANSPORTS.encode(), hashlib.sha256).digest()
    want = hmac.new(prk, b"kungfu_tf job secret v1\x01", hashlib.sha256).hexdigest()
    assert secrets == {want}
    other_job = detect_external_launch(ompi_env(0, 2, OMPI_MCA_orte_precondition_transports="1-2")).secret
    assert other_job != want
    # An exported secret wins (the user chose it for every rank with -x).
    assert detect_external_launch(ompi_env(0, 2, KUNGFU_JOB_SECRET=SECRET)).secret == SECRET


def test_open_mpi_derived_ports_are_below_the_ephemeral_range_and_per_job():
    a = detect_external_launch(ompi_env(0, 2))
    b = detect_external_launch(ompi_env(0, 2, OMPI_MCA_ess_base_jobid="1197604866"))
    base_a = int(a.peers[0].rsplit(":", 1)[1])
    assert a.peers[1] == f"127.0.0.1:{base_a + 1}"
    assert PORT_WINDOW_FIRST <= base_a and base_a + 1 < 32768
    assert base_a == derived_port_base("ompi-1197604865")
    assert a.peers != b.peers, "two jobs' derived bases should differ (different job ids)"


def test_open_mpi_several_nodes_use_kungfu_hosts_by_slot():
    hosts = "a:2,b:1"
    got = [
        detect_external_launch(ompi_env(r, 3, lr, ls, nodes=2, KUNGFU_HOSTS=hosts, KUNGFU_PORT_BASE="30000"))
        for r, lr, ls in ((0, 0, 2), (1, 1, 2), (2, 0, 1))
    ]
    assert {x.peers for x in got} == {("a:30000", "a:30001", "b:30000")}
    assert [x.self_address for x in got] == ["a:30000", "a:30001", "b:30000"]


def test_open_mpi_several_nodes_without_hosts_names_the_variable_to_pass():
    with pytest.raises(ExternalLaunchError, match=r"OMPI_MCA_orte_num_nodes=2.*mpirun -x KUNGFU_HOSTS=host1:2,host2:2"):
        detect_external_launch(ompi_env(2, 4, 0, 2, nodes=2))


def test_open_mpi_map_by_node_is_detected_from_local_ranks():
    # mpirun --map-by node -H a:2,b:2: rank 1 runs on b as its local rank 0.
    with pytest.raises(ExternalLaunchError, match=r"rank 1 is local rank 0 of 2 .* makes it local rank 1 of 2 on a"):
        detect_external_launch(ompi_env(1, 4, 0, 2, nodes=2, KUNGFU_HOSTS="a:2,b:2"))


def test_open_mpi_map_by_node_policy_is_rejected_on_every_rank():
    # Rank 0 lands on the first host under either mapping; the policy variable
    # (which mpirun --map-by node exports) still tells.
    env = ompi_env(0, 4, 0, 2, nodes=2, KUNGFU_HOSTS="a:2,b:2", OMPI_MCA_rmaps_base_mapping_policy="node")
    with pytest.raises(ExternalLaunchError, match=r"OMPI_MCA_rmaps_base_mapping_policy='node'.*drop --map-by node"):
        detect_external_launch(env)
    one_node = ompi_env(1, 2, OMPI_MCA_rmaps_base_mapping_policy="node")
    assert detect_external_launch(one_node).rank == 1, "on one node every mapping fills it in rank order"


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"OMPI_COMM_WORLD_SIZE": "three"}, r"OMPI_COMM_WORLD_SIZE must be a decimal integer >= 1, got 'three'"),
        ({"OMPI_COMM_WORLD_RANK": "5"}, r"OMPI_COMM_WORLD_RANK=5 must be less than OMPI_COMM_WORLD_SIZE=2"),
        ({"OMPI_MCA_orte_num_nodes": ""}, r"OMPI_MCA_orte_num_nodes must be a decimal integer >= 1, got ''"),
        ({"KUNGFU_HOSTS": "a:2,a:1"}, r"KUNGFU_HOSTS='a:2,a:1'.*listed twice"),
        ({"KUNGFU_HOSTS": "a:3"}, r"KUNGFU_HOSTS='a:3' lists 1 hosts with 3 ranks, but mpirun started 2 ranks"),
        ({"KUNGFU_PORT_BASE": "70000"}, r"KUNGFU_PORT_BASE must be a port number in 1..65535, got '70000'"),
        ({"KUNGFU_PORT_BASE": "65535"}, r"port base 65535 \(KUNGFU_PORT_BASE=65535\) \+ 2 ranks on one host exceeds"),
        ({"KUNGFU_JOB_SECRET": "abc"}, r"KUNGFU_JOB_SECRET must be 64 hexadecimal characters, got 3 characters"),
        ({"OMPI_MCA_orte_precondition_transports": "zz"},
         r"OMPI_MCA_orte_precondition_transports='zz' .*\(mpirun -x KUNGFU_JOB_SECRET\)"),
    ],
)
def test_open_mpi_malformed_variable_is_named_with_its_value(extra, pattern):
    with pytest.raises(ExternalLaunchError, match=pattern):
        detect_external_launch(ompi_env(0, 2, **extra))
    assert issubclass(ExternalLaunchError, WorkerEnvError)


def test_open_mpi_missing_transports_without_secret_is_an_error():
    env = ompi_env(0, 2)
    del env["OMPI_MCA_orte_precondition_transports"]
    with pytest.raises(ExternalLaunchError, match=r"OMPI_MCA_orte_precondition_transports=''"):
        detect_external_launch(env)


# --- which launcher, if any ----------------------------------------------------


def test_kungfu_run_workers_and_plain_runs_are_left_alone():
    kungfu_run = {"KUNGFU_PEERS": "127.0.0.1:10000,127.0.0.1:10001", "KUNGFU_SELF": "127.0.0.1:10001"}
    assert detect_external_launch({**ompi_env(0, 2), **kungfu_run}) is None
    assert detect_external_launch({**slurm_env(0, 0, 2, "n1", "2"), **kungfu_run}) is None
    assert detect_external_launch({}) is None
    # Inside an sbatch script (no srun): the allocation's variables, no step.
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_ID": "1",
             "SLURM_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert detect_external_launch(batch) is None


def test_apply_writes_the_variables_once_and_leaves_one_process_jobs_alone():
    env = ompi_env(1, 2, KUNGFU_PORT_BASE="30000", OTHER="x")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))  # a free port for rank 1
        free = probe.getsockname()[1]
    env["KUNGFU_PORT_BASE"] = str(free - 1)
    launch = apply_external_launch(env)
    assert env["KUNGFU_SELF"] == f"127.0.0.1:{free}" and env["KUNGFU_PEERS"] == f"127.0.0.1:{free - 1},127.0.0.1:{free}"
    assert env["OTHER"] == "x" and launch.rank == 1
    snapshot = dict(env)
    assert apply_external_launch(env) is None and env == snapshot, "KUNGFU_PEERS is set now: nothing to derive"
    single = ompi_env(0, 1)
    del single["OMPI_MCA_orte_precondition_transports"]  # one process needs no secret
    assert apply_external_launch(single).size == 1 and "KUNGFU_PEERS" not in single


def test_open_mpi_taken_port_names_it_and_the_override():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = ompi_env(1, 2, KUNGFU_PORT_BASE=str(port - 1))
        with pytest.raises(ExternalLaunchError, match=rf"port {port}, where Open MPI rank 1 \(local rank 1\) must "
                           rf"listen, is in use .*KUNGFU_PORT_BASE={port - 1}.*set KUNGFU_PORT_BASE"):
            apply_external_launch(env)
        assert "KUNGFU_PEERS" not in env


# --- Slurm ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[01-03,7]", ["node01", "node02", "node03", "node7"]),
        ("a,b[9-11],c", ["a", "b9", "b10", "b11", "c"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("n[001-002]", ["n001", "n002"]),
        ("single", ["single"]),
    ],
)
def test_slurm_hostlist_expands_like_scontrol_show_hostnames(text, hosts):
    assert expand_hostlist(text, "SLURM_STEP_NODELIST") == hosts


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("", r"SLURM_STEP_NODELIST='': empty host name"),
        ("n[1-3", r"SLURM_STEP_NODELIST='n\[1-3': '\[' is never closed"),
        ("n1-3]", r"']' without '\['"),
        ("n[3-1]", r"range '3-1' ends before it starts"),
        ("n[a-b]", r"bad range 'a-b' in \[a-b\]"),
        ("n[1-9999999]", r"more than 1000000 hosts"),
    ],
)
def test_slurm_malformed_hostlist_is_named(text, pattern):
    with pytest.raises(WorkerEnvError, match=pattern):
        expand_hostlist(text, "SLURM_STEP_NODELIST")


def test_slurm_tasks_per_node_expand_and_reject_garbage():
    assert expand_tasks_per_node("2(x3),1", "V") == [2, 2, 2, 1]
    assert expand_tasks_per_node("4", "V") == [4]
    for bad in ("", "2(3)", "0", "2(x0)", "x"):
        with pytest.raises(WorkerEnvError, match=re.escape(f"V={bad!r}: bad item")):
            expand_tasks_per_node(bad, "V")


def test_slurm_block_distribution_over_nodes():
    # node[01-02] with 2 tasks each, c7 with 1: ranks 0-1, 2-3, 4.
    places = [(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)]
    got = [detect_external_launch(slurm_env(r, lr, 5, "node[01-02],c7", "2(x2),1", KUNGFU_PORT_BASE="30000"))
           for r, lr in places]
    want = ("node01:30000", "node01:30001", "node02:30000", "node02:30001", "c7:30000")
    assert {x.peers for x in got} == {want}
    assert [x.self_address for x in got] == list(want)
    assert {x.job_id for x in got} == {"slurm-4242.0"}
    one_node = detect_external_launch(slurm_env(1, 1, 2, "node01", "2", KUNGFU_PORT_BASE="30000"))
    assert one_node.peers == ("127.0.0.1:30000", "127.0.0.1:30001")


@pytest.mark.parametrize("distribution", ["cyclic", "cyclic:block", "plane=2", "arbitrary"])
def test_slurm_rejects_non_block_distribution(distribution):
    with pytest.raises(ExternalLaunchError, match=rf"SLURM_DISTRIBUTION={distribution!r}: only block distribution"):
        detect_external_launch(slurm_env(0, 0, 2, "n[1-2]", "1(x2)", SLURM_DISTRIBUTION=distribution))
    assert detect_external_launch(slurm_env(0, 0, 2, "n[1-2]", "1(x2)", SLURM_DISTRIBUTION="block:cyclic"))


def test_slurm_without_secret_says_how_to_export_one():
    env = slurm_env(0, 0, 2, "n1", "2")
    del env["KUNGFU_JOB_SECRET"]
    with pytest.raises(ExternalLaunchError, match=r"SLURM_NTASKS=2.*KUNGFU_JOB_SECRET is not set.*before srun"):
        detect_external_launch(env)
    single = slurm_env(0, 0, 1, "n1", "1")
    del single["KUNGFU_JOB_SECRET"]
    assert detect_external_launch(single).size == 1, "one task needs no secret"


@pytest.mark.parametrize(
    ("extra", "pattern"),
    [
        ({"SLURM_STEP_TASKS_PER_NODE": "3"}, r"SLURM_STEP_TASKS_PER_NODE='3' \(1 nodes, 3 tasks\) does not match"),
        ({"SLURM_STEP_NODELIST": "n[1-2]"}, r"does not match SLURM_STEP_NODELIST='n\[1-2\]' \(2 nodes\)"),
        ({"SLURM_PROCID": "-1"}, r"SLURM_PROCID must be a decimal integer >= 0, got '-1'"),
        ({"SLURM_LOCALID": "0"}, r"Slurm rank 1 is local rank 0 on its node, but block distribution"),
        ({"SLURM_JOB_ID": "x"}, r"SLURM_JOB_ID must be a decimal integer >= 0, got 'x'"),
    ],
)
def test_slurm_malformed_variable_is_named_with_its_value(extra, pattern):
    with pytest.raises(ExternalLaunchError, match=pattern):
        detect_external_launch(slurm_env(1, 1, 2, "n1", "2", **extra))
