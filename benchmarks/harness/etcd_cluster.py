"""Real etcd members on loopback, for the ``--config-store`` tests and benchmark.

``EtcdCluster(tmp_path, members=3)`` starts that many ``etcd`` processes (the
Debian package ``etcd-server``, ``make sysdeps`` installs it) on free
loopback ports, each with its own data directory, and waits until the
cluster answers. ``stop(i)`` SIGKILLs member ``i`` (a crashed host; its data
stays), ``start(i)`` brings it back with the same data, ``leader()`` says
which member leads (Maintenance.Status), ``close()`` kills them all.
With ``tls=EtcdServerTls(...)`` the members serve their clients over TLS
(``https://`` client URLs; with a client CA, etcd's ``--client-cert-auth``).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import grpc

from kungfu_tf.proto import etcd_rpc_pb2, etcd_rpc_pb2_grpc

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
START_TIMEOUT = 30.0


def _free_ports(n: int) -> list[int]:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True)
class EtcdServerTls:
    """The members' certificate and key; ``client_ca``: require client certificates signed by it."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def flags(self) -> list[str]:
        flags = ["--cert-file", str(self.cert), "--key-file", str(self.key)]
        if self.client_ca is not None:
            flags += ["--client-cert-auth", "--trusted-ca-file", str(self.client_ca)]
        return flags


class EtcdCluster:
    """``members`` etcd processes forming one cluster on 127.0.0.1."""

    def __init__(
        self, directory: Path, members: int = 3, *, name: str = "kf", host: str = "127.0.0.1",
        exec_prefix: list[str] | None = None, tls: EtcdServerTls | None = None, flags: list[str] | None = None,
    ):
        """``host``: the address members listen on; ``exec_prefix``: a command prefix
        they run under (``ip netns exec NS``: members inside an emulated host, which
        this process cannot dial, so readiness is read from their logs); ``tls``: serve
        clients over TLS; ``flags``: more etcd flags for every member."""
        self.host = host
        self._prefix = list(exec_prefix or [])
        self._tls = tls
        self._flags = list(flags or [])  # more etcd flags for every member
        self._scheme = "https" if tls is not None else "http"
        assert Path(ETCD).exists(), "etcd is required (apt-get install etcd-server; make sysdeps does)"
        directory.mkdir(parents=True, exist_ok=True)
        ports = _free_ports(2 * members)
        self.client_ports = ports[:members]
        self.peer_ports = ports[members:]
        self.names = [f"{name}{i}" for i in range(members)]
        self.dirs = [directory / f"etcd-{n}" for n in self.names]
        self.logs = [directory / f"etcd-{n}.log" for n in self.names]
        self._procs: list[subprocess.Popen | None] = [None] * members
        self._log_start = [0] * members  # where each member's current run begins in its log
        self._initial = ",".join(f"{n}=http://{host}:{p}" for n, p in zip(self.names, self.peer_ports))
        self._token = f"kf-test-{directory.name}-{time.monotonic_ns()}"
        for i in range(members):
            self.start(i, wait=False)
        self.wait_ready()

    @property
    def endpoints(self) -> list[str]:
        return [f"{self.host}:{p}" for p in self.client_ports]

    @property
    def url(self) -> str:
        """The ``--config-store`` value that names every member."""
        return ("etcds://" if self._tls is not None else "etcd://") + ",".join(self.endpoints)

    def start(self, i: int, *, wait: bool = True) -> None:
        assert self._procs[i] is None or self._procs[i].poll() is not None
        cmd = [
            *self._prefix,
            ETCD,
            "--name", self.names[i],
            "--data-dir", str(self.dirs[i]),
            "--listen-client-urls", f"{self._scheme}://{self.host}:{self.client_ports[i]}",
            "--advertise-client-urls", f"{self._scheme}://{self.host}:{self.client_ports[i]}",
            *(self._tls.flags() if self._tls is not None else []),
            "--listen-peer-urls", f"http://{self.host}:{self.peer_ports[i]}",
            "--initial-advertise-peer-urls", f"http://{self.host}:{self.peer_ports[i]}",
            "--initial-cluster", self._initial,
            "--initial-cluster-token", self._token,
            "--initial-cluster-state", "new",
            # Short raft timers: elections after a leader's death take ~1 s, not ~5 s.
            "--heartbeat-interval", "100",
            "--election-timeout", "1000",
            *self._flags,
        ]
        log = open(self.logs[i], "ab")  # noqa: SIM115 (kept open by the process)
        self._log_start[i] = log.tell()
        self._procs[i] = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        if wait:
            self.wait_ready([i])

    def stop(self, i: int) -> None:
        """SIGKILL member ``i`` (its data directory stays for start(i))."""
        proc = self._procs[i]
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self._procs) if p is not None and p.poll() is None]

    def status(self, i: int, timeout: float = 2.0) -> etcd_rpc_pb2.StatusResponse:
        with grpc.insecure_channel(self.endpoints[i]) as channel:
            return etcd_rpc_pb2_grpc.MaintenanceStub(channel).Status(etcd_rpc_pb2.StatusRequest(), timeout=timeout)

    def leader(self) -> int:
        """Index of the member that leads now (waits for an election)."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for i in self.running():
                with contextlib.suppress(grpc.RpcError):
                    s = self.status(i)
                    if s.leader and s.leader == s.header.member_id:
                        return i
            assert time.monotonic() < deadline, f"no etcd leader within {START_TIMEOUT} s"
            time.sleep(0.1)

    def wait_ready(self, members: list[int] | None = None) -> None:
        """Until each member answers Status and knows a leader."""
        deadline = time.monotonic() + START_TIMEOUT
        for i in members if members is not None else range(len(self._procs)):
            while True:
                proc = self._procs[i]
                assert proc is not None and proc.poll() is None, (
                    f"etcd member {self.names[i]} exited: {self.logs[i].read_text()[-3000:]}"
                )
                if self._prefix or self._tls is not None:  # not dialled from here: its log says
                    with open(self.logs[i], "rb") as f:
                        f.seek(self._log_start[i])
                        ready = b"ready to serve client requests" in f.read()
                    if ready:
                        break
                else:
                    with contextlib.suppress(grpc.RpcError):
                        if self.status(i).leader:
                            break
                assert time.monotonic() < deadline, (
                    f"etcd member {self.names[i]} not ready in {START_TIMEOUT} s: {self.logs[i].read_text()[-3000:]}"
                )
                time.sleep(0.1)

    def close(self) -> None:
        for i in range(len(self._procs)):
            self.stop(i)
