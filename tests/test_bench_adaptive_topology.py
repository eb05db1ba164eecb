"""benchmarks/adaptive_topology/run.py: phase accounting, the contention schedule and the background traffic.

The benchmark itself needs root, network namespaces and minutes; these check
its logic cheaply: steps assigned to phases by their times (made-up steps),
the traffic switched at the right reported steps (fake output lines), and the
real traffic processes on loopback (bytes flow, everything is gone after).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
from waiting import eventually

from benchmarks.adaptive_topology.background_traffic import (
    BackgroundTraffic,
    parse_rate,
)
from benchmarks.adaptive_topology.run import ContentionSchedule, parse_run, summarize
from benchmarks.harness.timing import RESULT_TAG


def steps_of(durations: list[float], topology: str = "RING") -> list[dict]:
    out, t = [], 100.0
    for i, d in enumerate(durations):
        out.append({"step": i, "start": t, "end": t + d, "topology": topology})
        t += d
    return out


def test_phases_by_time_and_throughput_over_wall_time():
    # 3 steps of 1 s, then 4 of 2 s (contended), then 2 of 1 s; traffic on at
    # 103.5 (inside step 3) and off at 111 (exactly the end of step 6).
    steps = steps_of([1, 1, 1, 2, 2, 2, 2, 1, 1])
    steps[5]["topology"] = steps[6]["topology"] = "BINARY_TREE_STAR"
    s = summarize(
        {"steps": steps, "batch_size": 8, "traffic_on": 103.5, "traffic_off": 111.0}
    )
    assert s["steps"] == {"before": 3, "during": 3, "after": 2, "transition": 1}
    t = s["throughput"]
    assert t["before"] == pytest.approx(8.0)  # 3 steps x 8 samples / 3 s
    assert t["during"] == pytest.approx(4.0)  # steps 4-6: 24 samples / 6 s
    assert t["during_second_half"] == pytest.approx(4.0)  # steps 5, 6
    assert t["after"] == pytest.approx(8.0)
    assert s["last_topology"] == {
        "before": "RING",
        "during": "BINARY_TREE_STAR",
        "after": "RING",
    }
    assert s["topologies"]["during"] == ["BINARY_TREE_STAR", "RING"]


def test_uneven_steps_weigh_by_time_not_by_count():
    # A mean of per-step rates would give (8 + 0.8) / 2 = 4.4; the phase's rate is 16 / 11 s.
    steps = steps_of([1, 10])
    s = summarize(
        {"steps": steps, "batch_size": 8, "traffic_on": 0.0, "traffic_off": 1e9}
    )
    assert s["throughput"]["during"] == pytest.approx(16 / 11)


def test_run_names():
    assert parse_run(" binary_tree_star ") == ("BINARY_TREE_STAR", False)
    assert parse_run("RING:adaptive") == ("RING", True)
    with pytest.raises(ValueError, match="unknown topology 'TORUS'"):
        parse_run("torus")
    with pytest.raises(ValueError, match="unknown mode 'fast'"):
        parse_run("RING:fast")


class FakeTraffic:
    def __init__(self):
        self.calls: list[str] = []

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")


def line(record: dict) -> str:
    return "[0] " + RESULT_TAG + json.dumps(record)  # kungfu-run prefixes the rank


def test_schedule_switches_after_the_reported_steps():
    traffic = FakeTraffic()
    schedule = ContentionSchedule(traffic, before=2, during=3)
    seen = []
    for step in range(7):
        schedule.on_line(0, line({"kind": "step", "step": step}))
        schedule.on_line(
            1, line({"kind": "step", "step": step})
        )  # host B's launcher: ignored
        schedule.on_line(0, f"[1] step {step} done")  # not a result line
        seen.append(list(traffic.calls))
    assert seen[0] == [] and seen[1] == [
        "start"
    ]  # steps 0, 1 done: contention from step 2
    assert seen[3] == ["start"] and seen[4] == ["start", "stop"]  # steps 2-4 contended
    assert traffic.calls == ["start", "stop"] and schedule.error is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def loopback_bytes() -> int:
    for row in Path("/proc/net/dev").read_text().splitlines():
        name, _, fields = row.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[0])
    raise AssertionError("no lo in /proc/net/dev")


def test_background_traffic_flows_and_stops_on_loopback():
    port = free_port()
    with BackgroundTraffic(["127.0.0.1"], port, flows=2) as traffic:
        before = loopback_bytes()
        traffic.start()
        # It flows: 5 MB over loopback, waited for (a loaded host moves them
        # later; the hang bound rules out "never"), not expected within 0.5 s.
        flowed = eventually(lambda: loopback_bytes() - before > 5_000_000)
        moved = loopback_bytes() - before
        senders, sinks = list(traffic._senders), list(traffic._sinks)
        assert traffic.started_at is not None and traffic.running
        traffic.stop()
        assert all(p.poll() is not None for p in senders) and not traffic.running
        assert traffic.stopped_at >= traffic.started_at
        assert all(p.poll() is None for p in sinks)  # kept for the next start
    assert flowed, f"only {moved} bytes over loopback"
    assert all(p.poll() is not None for p in sinks)
    # The port is free again: binding it succeeds (raises OSError otherwise).
    with socket.create_server(("127.0.0.1", port)) as again:
        assert again.getsockname()[1] == port


def test_background_traffic_fails_clearly_when_the_sink_cannot_listen():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        traffic = BackgroundTraffic(["127.0.0.1"], port)
        with pytest.raises(
            RuntimeError,
            match=r"sink 127\.0\.0\.1 .* printed .*, not 'READY'.*Address already in use",
        ):
            traffic.start()
        assert not traffic.running and not traffic._sinks


def test_rates_in_tc_units():
    assert (
        parse_rate("40mbit") == 5e6
        and parse_rate("1.5Gbit") == 1.5e9 / 8
        and parse_rate("800kbit") == 1e5
    )
    for bad in ("40", "fast", "-1mbit", "mbit"):
        with pytest.raises(ValueError, match=f"rate '{bad}'"):
            parse_rate(bad)


def test_paced_sender_keeps_its_rate():
    received = []
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        sender = subprocess.Popen(
            [sys.executable, str(BENCH / "adaptive_topology" / "background_traffic.py"), "send", "127.0.0.1", str(port), "2", "2000000"],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            conns = [server.accept()[0] for _ in range(2)]
            assert sender.stdout.readline().strip() == "SENDING"
            threads = [
                threading.Thread(target=count_into, args=(c, received)) for c in conns
            ]
            started = time.monotonic()
            for t in threads:
                t.start()
            # At least 1.5 s of pacing and some bytes through: waited for (a
            # loaded host sends later); the hang bound only rules out "never".
            assert eventually(lambda: time.monotonic() - started >= 1.5 and sum(received) > 2e5), received
            total = sum(received)
            elapsed = time.monotonic() - started
        finally:
            os.killpg(sender.pid, signal.SIGKILL)
            sender.wait()
            sender.stdout.close()
        for t in threads:
            t.join(timeout=5)
    # Pacing caps the rate: at most 2 MB/s over the measured time plus what the
    # socket buffers took at once (1.5 MB). An unpaced sender moves hundreds of
    # MB here. The lower bound only says it sent at all (waited for above).
    assert 2e5 < total <= 2e6 * elapsed + 1.5e6, f"{total} bytes in {elapsed:.2f} s at 2 MB/s"


def count_into(conn: socket.socket, received: list[int]) -> None:
    # The sender resets its connections when killed (SO_LINGER 0).
    with conn, contextlib.suppress(ConnectionResetError):
        while data := conn.recv(1 << 16):
            received.append(len(data))
