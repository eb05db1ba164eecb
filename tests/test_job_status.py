"""kungfu-run's job status: formatting, in-place vs plain rendering, and a real elastic job's status lines."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import time

from conftest import REPO_ROOT, finish_job, kill_tree, worker_env, worker_path

from kungfu_tf.proto import config_pb2
from kungfu_tf.run.plan.cli import parse_args
from kungfu_tf.run.providers.job_status import (
    JobStatus,
    StatusDisplay,
    StepRate,
    format_duration,
    format_status,
)
from kungfu_tf.run.providers.output import Console

WORKER = worker_path("elastic_progress_worker.py")


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_text():
    assert format_status(JobStatus(elapsed=65, workers=3, version=2, step=40, steps_per_s=0.5)) == (
        "cluster v2, 3 workers, step 40 (0.50 steps/s), 1m05s elapsed")
    assert format_status(JobStatus(elapsed=65, workers=3, version=2, step=40)) == "cluster v2, 3 workers, step 40, 1m05s elapsed"
    assert format_status(JobStatus(elapsed=3, workers=2, steps_per_s=None)) == "2 workers, 3s elapsed"
    assert format_status(JobStatus(elapsed=0, workers=1, step=7, steps_per_s=1234.4)).startswith("1 worker, step 7 (1234 steps/s)")
    assert format_duration(3600) == "1h00m"


def test_step_rate_restarts_when_the_step_goes_back():
    rate = StepRate()
    assert rate.update(0, 0) is None  # never reported
    assert rate.update(10, 1000) is None
    assert rate.update(30, 2000) == 20.0
    assert rate.update(5, 3000) is None  # restarted from a checkpoint
    assert rate.update(15, 4000) == 10.0


def test_plain_lines_every_s_seconds():
    err = io.StringIO()
    clock = FakeClock()
    display = StatusDisplay(Console(io.StringIO(), err), 30, clock=clock)
    assert not display.due()
    clock.now += 30
    assert display.due()
    display.show(4, 3, config_pb2.JobProgress(step=100, version=3, reported_ms=5000))
    assert not display.due()
    clock.now += 30
    display.show(4, 3, config_pb2.JobProgress(step=400, version=3, reported_ms=35000))
    display.close()
    assert err.getvalue() == (
        "[kungfu-run] status: cluster v3, 4 workers, step 100, 30s elapsed\n"
        "[kungfu-run] status: cluster v3, 4 workers, step 400 (10.0 steps/s), 1m00s elapsed\n"
    )


def test_zero_disables_the_status():
    display = StatusDisplay(Console(io.StringIO(), FakeTerminal()), 0, clock=FakeClock())
    assert not display.enabled and not display.due()


def test_in_place_line_is_cleared_before_other_lines_and_drawn_again():
    out, err = FakeTerminal(), FakeTerminal()
    console = Console(out, err)
    assert console.status_in_place
    clock = FakeClock()
    display = StatusDisplay(console, 30, clock=clock)
    clock.now += 1  # on a terminal: every second, whatever --status-every says
    assert display.due()
    display.show(2, 1)
    console.err(b"[0] hello\n")
    console.event("cluster v2: 2 -> 1 workers (lost h:2: exit code 1)")
    display.close()
    assert out.getvalue() == ""
    erase = "\r\x1b[K"
    line = "[kungfu-run] cluster v1, 2 workers, 1s elapsed"
    assert err.getvalue() == (
        f"{erase}{line}"
        f"{erase}[0] hello\n{line}"
        f"{erase}[kungfu-run] cluster v2: 2 -> 1 workers (lost h:2: exit code 1)\n{line}"
        f"{erase}"
    )
    # Every line a worker or the launcher wrote starts at column 0 of a clean line.
    assert [text.split("\n")[0] for text in err.getvalue().split(erase)[2:4]] == [
        "[0] hello", "[kungfu-run] cluster v2: 2 -> 1 workers (lost h:2: exit code 1)"]


def test_status_every_option():
    assert parse_args(["-np", "1", "true"]).status_every == 30.0
    assert parse_args(["-np", "1", "--status-every", "0", "true"]).status_every == 0.0


def test_elastic_job_shows_version_size_and_step(tmp_path):
    stop = tmp_path / "stop"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kungfu_tf.run", "-np", "2", "--elastic", "--status-every", "1",
         sys.executable, WORKER, str(stop)],
        cwd=REPO_ROOT, env=worker_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    seen: list[str] = []
    status = re.compile(r"\[kungfu-run\] status: cluster v1, 2 workers, step ([1-9]\d*)\b.*elapsed")
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        for line in proc.stderr:
            seen.append(line)
            if status.match(line) or time.monotonic() > deadline:
                break
    finally:
        stop.touch()
    assert any(status.match(line) for line in seen), "".join(seen)
    try:
        rc, out, err = finish_job(proc, 60)
    finally:
        kill_tree(proc)
    assert rc == 0, "".join(seen) + err
    assert sorted(re.findall(r"^\[(\d)\] stopped at step \d+$", out, re.MULTILINE)) == ["0", "1"]
