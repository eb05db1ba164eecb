"""benchmarks/allreduce/targets.py: the targets are judged against the transport the workers use.

Every benchmark worker runs on one host, where peers talk over Unix sockets;
judging them against raw TCP loopback (slower) made a 78% result read 135%.
Pure Python: made-up measurements, no processes.
"""

from __future__ import annotations

import pytest

from benchmarks.allreduce.report import raw_table, targets_table
from benchmarks.allreduce.targets import MIB, evaluate

GB = 1e9
RAW = {
    "tcp": {"exchange": {"bytes_per_s_each_way": 1.14 * GB}, "pingpong": {"rtt_median_s": 114e-6, "placement": "split"}},
    "unix": {"exchange": {"bytes_per_s_each_way": 1.97 * GB}, "pingpong": {"rtt_median_s": 84.7e-6, "placement": "split"}},
}


def point(np_: int, size: int, busbw: float, median_s: float) -> dict:
    return {"impl": "kungfu", "topology": "AUTO", "np": np_, "size": size, "busbw": busbw, "median_s": median_s}


POINTS = [point(2, 64 * MIB, 1.54 * GB, 43.7e-3), point(2, 4, 0.0, 630e-6)]


def record(evals: list[dict], np_: int, size: int) -> dict:
    return next(e for e in evals if e["np"] == np_ and e["size"] == size and e["contender"] == "AUTO")


def test_targets_use_the_unix_socket_when_measured():
    evals = evaluate(POINTS, RAW)
    bandwidth = record(evals, 2, 64 * MIB)
    assert bandwidth["ratio"] == pytest.approx(1.54 / 1.97)  # 78%, not 135% of TCP
    assert bandwidth["met"] is False and bandwidth["yardstick"] == "Unix socket"
    assert "Unix socket" in bandwidth["target"]
    latency = record(evals, 2, 4)
    assert latency["ratio"] == pytest.approx(630 / 84.7)
    table = targets_table(evals)
    assert "78% of the Unix socket" in table and "TCP" not in table


def test_targets_fall_back_to_tcp_without_a_unix_figure():
    evals = evaluate(POINTS, {"tcp": RAW["tcp"]})
    bandwidth = record(evals, 2, 64 * MIB)
    assert bandwidth["ratio"] == pytest.approx(1.54 / 1.14)
    assert bandwidth["yardstick"] == "TCP loopback" and "TCP loopback" in bandwidth["target"]


def test_latency_floor_is_given_against_both_transports():
    text = raw_table({**RAW, "tf_function_floor": {"median_s": 451e-6}})
    assert "4.0× the cross-CPU TCP RTT and 5.3× the cross-CPU Unix-socket RTT" in text
