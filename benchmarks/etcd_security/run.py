"""What etcd's TLS and authentication cost a ``--config-store`` client, side by side.

Four single-member etcd clusters on loopback, one per client setup: plain;
TLS with ``--client-cert-auth``; authentication enabled (user root); TLS and
authentication. In interleaved rounds (so that the machine's load falls on
all alike), for each setup:

* **one call**: the median seconds of one ``EtcdClient.put`` (a write that
  etcd commits through raft, as every membership change is);
* **first call**: the median seconds from a new client to its first answered
  ``put``: the connection, the TLS handshake, and Auth.Authenticate (etcd
  checks the password with bcrypt) — paid once per launcher, and again
  when a token expires.

Usage: ``python -m benchmarks.etcd_security [--calls N] [--rounds R]``;
prints the table for docs/guide/benchmarks.md with the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from benchmarks.harness.etcd_certificates import make_certificates
from benchmarks.harness.etcd_cluster import EtcdCluster, EtcdServerTls
from kungfu_tf.proto import etcd_rpc_pb2 as pb
from kungfu_tf.proto import etcd_rpc_pb2_grpc as pb_grpc
from kungfu_tf.run.control.etcd_client import EtcdClient
from kungfu_tf.run.control.etcd_security import EtcdSecurity

PASSWORD = "bench-password"


def _enable_auth(channel: grpc.Channel) -> None:
    auth = pb_grpc.AuthStub(channel)
    auth.UserAdd(pb.AuthUserAddRequest(name="root", password=PASSWORD), timeout=10)
    auth.UserGrantRole(pb.AuthUserGrantRoleRequest(user="root", role="root"), timeout=10)
    auth.AuthEnable(pb.AuthEnableRequest(), timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="puts per setup and round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (and new clients per setup)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certificates(Path(tmp) / "certs")
        tls_files = {"ca": (certs / "ca.crt").read_bytes(), "cert": (certs / "client.crt").read_bytes(),
                     "key": (certs / "client.key").read_bytes()}  # fmt: skip
        server_tls = EtcdServerTls(cert=certs / "server.crt", key=certs / "server.key", client_ca=certs / "ca.crt")
        plain, tls, plain_auth, tls_auth = clusters = [
            EtcdCluster(Path(tmp) / name, members=1, name=name, tls=server_tls if "tls" in name else None)
            for name in ("plain", "tls", "plainauth", "tlsauth")
        ]
        try:
            with grpc.insecure_channel(plain_auth.endpoints[0]) as channel:
                _enable_auth(channel)
            credentials = grpc.ssl_channel_credentials(tls_files["ca"], tls_files["key"], tls_files["cert"])
            with grpc.secure_channel(tls_auth.endpoints[0], credentials) as channel:
                _enable_auth(channel)
            setups = {
                "plain": (plain, EtcdSecurity()),
                "TLS (client certificate)": (tls, EtcdSecurity(tls=True, **tls_files)),
                "user and password": (plain_auth, EtcdSecurity(user="root", password=PASSWORD)),
                "TLS and user": (tls_auth, EtcdSecurity(tls=True, user="root", password=PASSWORD, **tls_files)),
            }
            results = _measure(setups, args)
        finally:
            for cluster in clusters:
                cluster.close()
    load_after = os.getloadavg()

    base_call = statistics.median(results["plain"]["call"])
    base_first = statistics.median(results["plain"]["first"])
    print(f"load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; cpus {os.cpu_count()}; "
          f"{args.rounds} rounds x {args.calls} puts per setup, one etcd member on loopback")  # fmt: skip
    print()
    print("| client setup | one put (median) | vs plain | first put of a new client (median) | vs plain |")
    print("|---|---|---|---|---|")
    for name, r in results.items():
        call, first = statistics.median(r["call"]), statistics.median(r["first"])
        print(f"| {name} | {call * 1e3:.2f} ms | {call / base_call:.2f}× | {first * 1e3:.1f} ms | "
              f"{first / base_first:.2f}× |")  # fmt: skip
    return 0


def _measure(setups: dict, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """Per setup, the seconds of each put and of each new client's first put (rounds interleave the setups)."""
    results: dict[str, dict[str, list[float]]] = {name: {"call": [], "first": []} for name in setups}
    for r in range(args.rounds):
        for name, (cluster, security) in setups.items():
            start = time.perf_counter()
            with EtcdClient(cluster.endpoints, security=security) as client:
                client.put(b"/bench/first", b"x")
                results[name]["first"].append(time.perf_counter() - start)
                for i in range(args.calls):
                    t = time.perf_counter()
                    client.put(b"/bench/key", str(i).encode())
                    results[name]["call"].append(time.perf_counter() - t)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    return results
