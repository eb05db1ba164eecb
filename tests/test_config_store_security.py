"""``--config-store`` over etcd's own TLS and authentication, against real etcd members.

Certificates are made for the test with the ``openssl`` CLI
(benchmarks/harness/etcd_certificates.py: a CA, the member's certificate for
127.0.0.1, a client certificate, and a second, unrelated CA);
a single etcd member serves TLS with ``--client-cert-auth``, another has
authentication enabled through the Auth API (no etcdctl needed). What is
checked: the store works over TLS and with a user, and each misconfiguration
(bad file, wrong CA, missing client certificate, plain client to a TLS member,
wrong or missing password) fails at once with an error naming its cause.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import grpc
import pytest
from conftest import REPO_ROOT, worker_env, worker_path

from benchmarks.harness.etcd_certificates import make_certificates
from benchmarks.harness.etcd_cluster import EtcdCluster, EtcdServerTls
from kungfu_tf.proto import etcd_rpc_pb2 as pb
from kungfu_tf.proto import etcd_rpc_pb2_grpc as pb_grpc
from kungfu_tf.run.control.etcd_client import (
    EtcdAuthError,
    EtcdClient,
    EtcdTlsError,
    EtcdUnavailableError,
)
from kungfu_tf.run.control.etcd_security import EtcdSecurity
from kungfu_tf.run.errors import LaunchError
from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.plan.elastic_plan import build_elastic_plan

FAKE = worker_path("elastic_fake_worker.py")
SECRET = "0123456789abcdef" * 4
PASSWORD = "correct horse battery staple"
TOKEN_TTL = 3  # seconds an unused token lives (etcd's default is 300)
CALL_SECONDS = 2.0  # a refused handshake fails at once; this bounds the worst case


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    return make_certificates(tmp_path_factory.mktemp("tls") / "certs")


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory, certs):
    tls = EtcdServerTls(cert=certs / "server.crt", key=certs / "server.key", client_ca=certs / "ca.crt")
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd-tls"), members=1, name="tls", tls=tls)
    yield cluster
    cluster.close()


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory):
    """One member with authentication enabled: user root (role root) with PASSWORD."""
    cluster = EtcdCluster(
        tmp_path_factory.mktemp("etcd-auth"), members=1, name="auth", flags=["--auth-token-ttl", str(TOKEN_TTL)]
    )
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        auth = pb_grpc.AuthStub(channel)
        auth.UserAdd(pb.AuthUserAddRequest(name="root", password=PASSWORD), timeout=10)
        auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
        auth.AuthEnable(pb.AuthEnableRequest(), timeout=10)
    yield cluster
    cluster.close()


def plan_for(url: str, extra: list[str], environ: dict[str, str]):
    args = ["-np", "1", "--elastic", "-H", "127.0.0.1:1", "--config-store", url, *extra, "true"]
    env = {"KUNGFU_JOB_SECRET": SECRET, "KUNGFU_JOB_ID": f"sec-{uuid.uuid4().hex[:8]}", **environ}
    return build_elastic_plan(parse_args(args), env)


def round_trip(client: EtcdClient) -> bytes:
    key = f"/kf-test/{uuid.uuid4().hex}".encode()
    client.put(key, b"v")
    kvs, _ = client.range(key)
    return kvs[0].value


# ----------------------------------------------------------------- options


def test_bad_security_options_are_named(tmp_path, certs):
    (tmp_path / "notpem").write_text("hello\n")
    (tmp_path / "empty").write_text("")
    url, tls_url = "etcd://127.0.0.1:2379", "etcds://127.0.0.1:2379"
    missing = tmp_path / "missing.crt"
    cases = [
        (tls_url, ["--config-store-ca", str(missing)], {},
         f"--config-store-ca {missing}: cannot read it (No such file or directory)"),
        (tls_url, ["--config-store-ca", str(tmp_path / "notpem")], {}, "the file holds no a PEM certificate"),
        (tls_url, [], {"KUNGFU_CONFIG_STORE_KEY": str(certs / "client.key")},
         f"KUNGFU_CONFIG_STORE_KEY={certs / 'client.key'} needs --config-store-cert"),
        (url, ["--config-store-ca", str(certs / "ca.crt")], {}, "needs TLS: name the members as etcds://"),
        (url, ["--config-store-user", "root"], {}, "--config-store-user root needs its password: export"),
        (url, [], {"KUNGFU_CONFIG_STORE_PASSWORD": "x"}, "is given without --config-store-user"),
        (url, ["--config-store-user", "root", "--config-store-password-file", str(tmp_path / "empty")], {},
         "the file is empty"),
    ]  # fmt: skip
    for store, extra, environ, message in cases:
        with pytest.raises(LaunchError, match=re.escape(message)):
            plan_for(store, extra, environ)
    plain = plan_for(url, [], {})
    assert plain.config_store_security is None


def test_security_options_need_an_elastic_job(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["-np", "1", "--config-store-user", "root", "true"])
    assert exit_.value.code == 2
    assert "--config-store-user root is only used by elastic jobs with --config-store" in capsys.readouterr().err


def test_password_option_does_not_exist(capsys):
    """The password is never taken from the command line (ps shows it to every user)."""
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "--elastic", "--config-store", "etcd://a:1", "--config-store-password", "x", "true"])
    assert "--config-store-password" in capsys.readouterr().err


# --------------------------------------------------------------------- TLS


def test_store_over_tls_with_a_client_certificate(tls_etcd, certs):
    assert tls_etcd.url.startswith("etcds://")
    plan = plan_for(
        tls_etcd.url,
        ["--config-store-ca", str(certs / "ca.crt"), "--config-store-key", str(certs / "client.key")],
        {"KUNGFU_CONFIG_STORE_CERT": str(certs / "client.crt")},
    )
    with EtcdClient(plan.config_store, security=plan.config_store_security) as client:
        assert round_trip(client) == b"v"


def test_tls_misconfigurations_name_the_handshake(tls_etcd, certs):
    read = lambda name: (certs / name).read_bytes()
    client_pair = {"cert": read("client.crt"), "key": read("client.key")}
    wrong_ca = EtcdSecurity(tls=True, ca=read("wrongca.crt"), ca_source="--config-store-ca wrongca.crt", **client_pair)
    cases = [
        (wrong_ca, "check that --config-store-ca wrongca.crt signed the members' certificates"),
        (EtcdSecurity(tls=True, ca=read("ca.crt")), "--client-cert-auth, that the client certificate"),
    ]
    for security, cause in cases:
        with (
            EtcdClient(tls_etcd.endpoints, security=security, call_seconds=CALL_SECONDS) as client,
            pytest.raises(EtcdTlsError, match=r"TLS handshake with etcd failed for Put \(.*\): ") as error,
        ):
            client.put(b"/x", b"y")
        assert cause in str(error.value)
    # A plaintext client: the member drops it without a TLS alert gRPC could report.
    with (
        EtcdClient(tls_etcd.endpoints, call_seconds=CALL_SECONDS) as client,
        pytest.raises(EtcdUnavailableError, match=re.escape("may serve TLS only: name it etcds://")),
    ):
        client.put(b"/x", b"y")


# -------------------------------------------------------------------- auth


def test_user_and_password_from_a_file(auth_etcd, tmp_path):
    (tmp_path / "pw").write_text(PASSWORD + "\n")
    plan = plan_for(
        auth_etcd.url, ["--config-store-user", "root"], {"KUNGFU_CONFIG_STORE_PASSWORD_FILE": str(tmp_path / "pw")}
    )
    with EtcdClient(plan.config_store, security=plan.config_store_security) as client:
        assert round_trip(client) == b"v"


def test_an_expired_token_is_replaced(auth_etcd):
    """A launcher idle for longer than the token's TTL (etcd then answers "invalid
    auth token") authenticates again instead of failing."""
    security = EtcdSecurity(user="root", password=PASSWORD)
    with EtcdClient(auth_etcd.endpoints, security=security) as client:
        assert round_trip(client) == b"v"
        time.sleep(TOKEN_TTL + 2)  # waits for the expiry; how long the calls take does not matter
        assert round_trip(client) == b"v"


def test_wrong_or_missing_password_is_named(auth_etcd):
    wrong = EtcdSecurity(user="root", password="guess", password_source="the password of KUNGFU_CONFIG_STORE_PASSWORD")
    with (
        EtcdClient(auth_etcd.endpoints, security=wrong, call_seconds=CALL_SECONDS) as client,
        pytest.raises(EtcdAuthError) as error,
    ):
        client.put(b"/x", b"y")
    assert str(error.value).startswith(
        "etcd authentication failed for user 'root' with the password of KUNGFU_CONFIG_STORE_PASSWORD"
    )
    assert "invalid user ID or password" in str(error.value)
    missing = "authentication is enabled on this cluster: give a user and password"
    with (
        EtcdClient(auth_etcd.endpoints, call_seconds=CALL_SECONDS) as client,
        pytest.raises(EtcdAuthError, match=missing),
    ):
        client.put(b"/x", b"y")


# ---------------------------------------------------------- kungfu-run itself


def launch(url: str, extra: list[str], **env: str) -> subprocess.CompletedProcess:
    """A one-host elastic job of the config-service-only fake worker that grows from 1 to 2."""
    environ = worker_env(KUNGFU_JOB_SECRET=SECRET, KUNGFU_JOB_ID=f"sec-{uuid.uuid4().hex[:8]}", **env)
    cmd = [
        sys.executable, "-m", "kungfu_tf.run", "-np", "1", "--max-np", "2", "--elastic", "-H", "127.0.0.1:2",
        "--config-store", url, *extra, "--admit-window", "0", "--timeout", "60", sys.executable, FAKE, "grow", "2",
    ]  # fmt: skip
    return subprocess.run(
        cmd, cwd=REPO_ROOT, env=environ, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=90, check=False
    )


def test_a_job_grows_through_etcd_over_tls_and_with_a_user(tls_etcd, auth_etcd, certs, tmp_path):
    tls = ["--config-store-ca", str(certs / "ca.crt"), "--config-store-cert", str(certs / "client.crt"),
           "--config-store-key", str(certs / "client.key")]  # fmt: skip
    for url, extra, env in (
        (tls_etcd.url, tls, {}),
        (auth_etcd.url, ["--config-store-user", "root"], {"KUNGFU_CONFIG_STORE_PASSWORD": PASSWORD}),
    ):
        run = launch(url, extra, **env)
        info = run.stdout + run.stderr
        assert run.returncode == 0, info
        assert re.search(r"cluster v2: 1 -> 2 workers \(admitted 127\.0\.0\.1:\d+\)", info), info


def test_a_launcher_with_a_wrong_password_stops_and_says_why(auth_etcd):
    run = launch(auth_etcd.url, ["--config-store-user", "root"], KUNGFU_CONFIG_STORE_PASSWORD="guess")
    assert run.returncode != 0, run.stdout
    assert "etcd authentication failed for user 'root' with the password of KUNGFU_CONFIG_STORE_PASSWORD" in run.stderr
    assert "started" not in run.stdout + run.stderr, run.stdout


def test_a_watch_opened_with_an_expired_token_still_sees_changes(auth_etcd):
    """Launchers follow the job through a watch: one (re)opened after the token
    expired must authenticate again, not retry the stale token for ever."""
    security = EtcdSecurity(user="root", password=PASSWORD)
    key = f"/kf-test/watch-{uuid.uuid4().hex}".encode()
    with EtcdClient(auth_etcd.endpoints, security=security) as client:
        _, revision = client.range(key)  # authenticated
        time.sleep(TOKEN_TTL + 2)
        watch = client.watch(key, b"", revision + 1)
        seen: list[int] = []

        def follow() -> None:
            for r in watch:
                seen.append(r)
                if r:
                    return

        thread = threading.Thread(target=follow, daemon=True)
        thread.start()
        with EtcdClient(auth_etcd.endpoints, security=security) as writer:
            written = writer.put(key, b"v")
        thread.join(30)  # bounds a hang only; the verdict is what was seen
        watch.cancel()
    assert seen and seen[-1] == written, f"the watch saw {seen[:20]} (the write was at revision {written})"
