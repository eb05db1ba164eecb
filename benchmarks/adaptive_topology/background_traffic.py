"""Background TCP traffic that contends with a job for a link: bulk senders and discarding sinks.

Run as a program it is one end: ``sink ADDR PORT`` accepts any number of
connections and discards what arrives; ``send ADDR PORT FLOWS [RATE]`` opens
``FLOWS`` connections and writes zeros on them, ``RATE`` bytes/s in all
(paced), or as fast as TCP lets it (RATE 0 or none), until killed. Each prints
one line (``READY`` / ``SENDING``) once it is in place.

:class:`BackgroundTraffic` starts a sink on every address and senders from
each address to the next (both directions of a two-host link), each in its
own process group, optionally inside a network namespace, and stops them
again. Unpaced flows take an about even share *per flow* of a bottleneck
(TCP fairness), so a job with more connections across it keeps more
bandwidth; paced flows take their rate whenever their fair share is larger,
the same for any job, which makes topologies comparable.

Example:
    >>> traffic = BackgroundTraffic(["127.0.0.1", "127.0.0.1"], port=5201)  # doctest: +SKIP
    >>> traffic.start(); ...; traffic.stop()                                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Self

CHUNK = 16 * 1024
# A paced sender that fell behind (its flow was squeezed) does not burst to
# catch up by more than this much sending time.
MAX_CREDIT_S = 0.05
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_rate(text: str) -> float:
    """A rate in tc's units (bit, kbit, mbit, gbit per second) as bytes/s.

    Example:
        >>> parse_rate("40mbit")
        5000000.0
    """
    value = text.strip().lower()
    for unit in sorted(UNITS, key=len, reverse=True):
        if value.endswith(unit):
            number = value[: -len(unit)]
            try:
                bits = float(number) * UNITS[unit]
            except ValueError:
                break
            if bits < 0:
                break
            return bits / 8
    raise ValueError(
        f"rate {text!r}: write a number and one of {', '.join(UNITS)}, e.g. 40mbit"
    )


STARTUP_TIMEOUT_S = 60.0


def _discard(conn: socket.socket) -> None:
    # Senders reset their connections when killed (SO_LINGER 0).
    with conn, contextlib.suppress(ConnectionResetError):
        while conn.recv(1 << 20):
            pass


def sink(addr: str, port: int) -> None:
    """Accepts connections on (addr, port) forever, reading and dropping everything."""
    server = socket.create_server((addr, port), reuse_port=False)
    print("READY", flush=True)
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_discard, args=(conn,), daemon=True).start()


def send(addr: str, port: int, flows: int, rate: float = 0.0) -> None:
    """Writes zeros to (addr, port) on ``flows`` connections until killed, ``rate`` bytes/s in all (0: unpaced)."""
    conns = []
    for _ in range(flows):
        conn = socket.create_connection((addr, port), timeout=STARTUP_TIMEOUT_S)
        conn.settimeout(None)
        # Reset on close: when the benchmark kills us, what is still queued in
        # the socket buffers is dropped instead of contending after "stop".
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conns.append(conn)
    payload = bytes(CHUNK)
    per_flow = rate / flows
    for conn in conns[1:]:
        threading.Thread(
            target=_blast, args=(conn, payload, per_flow), daemon=True
        ).start()
    print("SENDING", flush=True)
    _blast(conns[0], payload, per_flow)


def _blast(conn: socket.socket, payload: bytes, rate: float) -> None:
    if rate <= 0:
        while True:
            conn.sendall(payload)
    interval = len(payload) / rate
    due = time.monotonic()
    while True:
        conn.sendall(payload)
        due = max(due + interval, time.monotonic() - MAX_CREDIT_S)
        time.sleep(max(0.0, due - time.monotonic()))


class BackgroundTraffic:
    """Bulk TCP traffic between ``addresses[i]`` and ``addresses[i + 1]`` (and the last to the first).

    ``flows`` connections per direction, ``rate`` bytes/s per direction in
    all (0: unpaced). ``prefixes[i]`` is prepended to the processes of
    address i (e.g. ``ip netns exec NS``). :meth:`start` returns once every sender is connected
    and has begun writing; ``started_at`` / ``stopped_at`` are the
    ``time.time()`` of the last start and stop, for matching against the
    job's step times.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        port: int,
        flows: int = 4,
        prefixes: Sequence[Sequence[str]] | None = None,
        rate: float = 0.0,
    ):
        if flows < 1:
            raise ValueError(f"flows must be at least 1, got {flows}")
        if rate < 0:
            raise ValueError(f"rate must be >= 0 bytes/s (0: unpaced), got {rate}")
        self.addresses = list(addresses)
        self.port, self.flows, self.rate = port, flows, rate
        self.prefixes = (
            [list(p) for p in prefixes] if prefixes else [[] for _ in addresses]
        )
        if len(self.prefixes) != len(self.addresses):
            raise ValueError(
                f"{len(self.prefixes)} prefixes for {len(self.addresses)} addresses"
            )
        self._sinks: list[subprocess.Popen[str]] = []
        self._senders: list[subprocess.Popen[str]] = []
        self.started_at: float | None = None
        self.stopped_at: float | None = None

    @property
    def running(self) -> bool:
        return bool(self._senders)

    def start(self) -> None:
        """Sinks (once) on every address, then the senders; returns when all are writing."""
        if self.running:
            raise RuntimeError("BackgroundTraffic.start(): already running")
        if not self._sinks:
            for prefix, addr in zip(self.prefixes, self.addresses, strict=True):
                self._sinks.append(
                    self._spawn(prefix, ["sink", addr, str(self.port)], "READY")
                )
        n = len(self.addresses)
        for i, prefix in enumerate(self.prefixes):
            target = self.addresses[(i + 1) % n]
            self._senders.append(
                self._spawn(
                    prefix,
                    ["send", target, str(self.port), str(self.flows), str(self.rate)],
                    "SENDING",
                )
            )
        self.started_at = time.time()

    def stop(self) -> None:
        """Kills the senders (their queued data is reset, not sent); the sinks stay for a restart."""
        if self.running:
            self.stopped_at = time.time()
        for proc in self._senders:
            _kill_group(proc)
        self._senders.clear()

    def close(self) -> None:
        """Stops everything, sinks included."""
        self.stop()
        for proc in self._sinks:
            _kill_group(proc)
        self._sinks.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(
        self, prefix: list[str], args: list[str], ready: str
    ) -> subprocess.Popen[str]:
        argv = [*prefix, sys.executable, os.path.abspath(__file__), *args]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # blocks until it is in place (or died)
        if line != ready:
            said = [line]
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)  # it died: its last words are its error
                said += proc.stdout.read().splitlines()
            _kill_group(proc)
            self.close()
            raise RuntimeError(
                f"background traffic: {' '.join(argv)} printed {line!r}, not {ready!r}: "
                + " | ".join(said[-2:])
            )
        return proc


def _kill_group(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def main(argv: list[str]) -> None:
    mode, addr, port, *rest = argv
    if mode == "sink":
        sink(addr, int(port))
    elif mode == "send":
        send(
            addr,
            int(port),
            int(rest[0]) if rest else 1,
            float(rest[1]) if len(rest) > 1 else 0.0,
        )
    else:
        raise SystemExit(
            f"benchmarks/adaptive_topology/background_traffic.py: unknown mode {mode!r}; use sink or send"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
