"""kungfu_tf/run/launch/config_service_port.py: the launcher's config service never takes an initial worker's port.

Found in CI: ``kungfu-run --elastic`` without ``--port-range`` picked its
workers' ports (kernel-chosen, then released) before it started the config
service on port 0, and the kernel gave the service rank 1's port: rank 1
failed with "cannot listen on 127.0.0.1:41823 ... Address already in use"
and the job lost a worker before its first step
(test_elastic_keras.py::test_a_policy_callback_resizes_inside_elastic_fit_beside_a_crash).
"""

from __future__ import annotations

import contextlib
import socket

import pytest

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import ConfigServer
from kungfu_tf.run.launch.config_service_port import start_avoiding


def maker(ports: list[int], admit_window: float = 0.0):
    """ConfigServers that get ``ports`` in turn, as if the kernel had chosen them for port 0."""
    made: list[ConfigServer] = []

    def make() -> ConfigServer:
        made.append(ConfigServer(ports.pop(0), secret="s" * 32, job_id="port-test", host="127.0.0.1",
                                 cluster=config_pb2.Cluster(version=1), elastic=True, admit_window=admit_window))  # fmt: skip
        return made[-1]

    return make, made


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def test_a_service_on_a_workers_port_is_refused_and_another_started():
    workers, other = free_ports(2)
    make, made = maker([workers, other])
    service = start_avoiding(make, taken={workers})
    try:
        assert len(made) == 2 and service is made[1] and service.port == other
        with socket.socket() as s:  # the refused one let its port go: the worker can listen there
            s.bind(("127.0.0.1", workers))
            s.listen()
    finally:
        service.stop(0)


def test_the_admission_timer_of_a_shared_job_state_survives_a_refused_start():
    # --config-store: the retries share one job state; a refused start must not have started its admission
    # timer (stopping a started one ends the shared state's timer for good).
    workers, other = free_ports(2)
    make, made = maker([workers, other], admit_window=5.0)
    service = start_avoiding(make, taken={workers})
    try:
        assert made[0]._admission_timer is None
        assert service._admission_timer is not None and service._admission_timer.is_alive()
    finally:
        service.stop(0)


def test_a_kernel_that_keeps_choosing_workers_ports_is_an_error_naming_them():
    workers = free_ports(1)[0]
    make, _ = maker([workers] * 3)
    with pytest.raises(OSError, match=rf"every one of 3 ports the kernel chose was one given to a worker \(\[{workers}\]\)"):
        start_avoiding(make, taken={workers}, attempts=3)
