"""kungfu_tf/run/launch/config_service_port.py: the launcher's config service never takes an initial worker's port.

Found in CI: ``kungfu-run --elastic`` without ``--port-range`` picked its
workers' ports (kernel-chosen, then released) before it started the config
service on port 0, and the kernel gave the service rank 1's port: rank 1
failed with "cannot listen on 127.0.0.1:41823 ... Address already in use"
and the job lost a worker before its first step
(test_elastic_keras.py::test_a_policy_callback_resizes_inside_elastic_fit_beside_a_crash).
"""

from __future__ import annotations

import pytest

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.control.config_server import ConfigServer
from kungfu_tf.run.launch.config_service_port import start_avoiding


class FakeService:
    """Takes the next of ``picks`` as the kernel's choice when started."""

    def __init__(self, picks: list[int], log: list[str]) -> None:
        self.picks, self.log, self.port = picks, log, 0

    def start(self) -> None:
        self.port = self.picks.pop(0)
        self.log.append(f"start {self.port}")

    def stop(self, grace: float | None = None) -> None:
        self.log.append(f"stop {self.port}")


def test_a_service_on_a_workers_port_is_stopped_and_started_again():
    picks, log = [41823, 41824, 50000], []
    service = start_avoiding(lambda: FakeService(picks, log), taken={41823, 41824})
    assert service.port == 50000
    assert log == ["start 41823", "stop 41823", "start 41824", "stop 41824", "start 50000"]


def test_a_kernel_that_keeps_choosing_workers_ports_is_an_error_naming_them():
    log: list[str] = []
    with pytest.raises(OSError, match=r"every one of 3 ports the kernel chose was one given to a worker \(\[7\]\)"):
        start_avoiding(lambda: FakeService([7, 7, 7], log), taken={7}, attempts=3)
    assert log.count("stop 7") == 3  # nothing left listening


def test_the_real_service_avoids_the_port_it_was_first_given():
    def make() -> ConfigServer:
        return ConfigServer(0, secret="s" * 32, job_id="port-test", host="127.0.0.1",
                            cluster=config_pb2.Cluster(version=1), elastic=True)  # fmt: skip

    first = make().start()
    taken = first.port
    first.stop(0)
    service = start_avoiding(make, taken={taken})
    try:
        assert service.port not in (0, taken)
    finally:
        service.stop(0)
