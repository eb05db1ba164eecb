"""No test skips what CI (root, 2 cores) could run.

The only skip left is the network-namespace one of tests/netns.py, and it
must turn into a failure when running as root, as CI does.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import netns
import pytest

from benchmarks.harness import netns as namespaces

TESTS_DIR = Path(__file__).resolve().parent
SKIP_CALL = re.compile(r"\bpytest\.(skip|importorskip)\(|\bmark\.skipif\b|\bmark\.skip\b|\bmark\.xfail\b")


class FakeRequest:
    def addfinalizer(self, fn):
        raise AssertionError("nothing was created, so nothing needs cleaning up")


def refuse_netns(monkeypatch, euid: int) -> None:
    def ip(*args):
        return subprocess.CompletedProcess(["ip", *args], 1, "", "mount --make-shared /run/netns failed: Operation not permitted")

    monkeypatch.setattr(namespaces, "ip", ip)
    monkeypatch.setattr(netns.os, "geteuid", lambda: euid)


def test_refused_namespaces_fail_as_root(monkeypatch):
    refuse_netns(monkeypatch, euid=0)
    with pytest.raises(pytest.fail.Exception, match="Operation not permitted.*running as root"):
        netns.make_two_hosts(FakeRequest(), "10.250.0", "kfs")


def test_refused_namespaces_skip_without_root(monkeypatch):
    refuse_netns(monkeypatch, euid=1000)
    with pytest.raises(pytest.skip.Exception, match="Operation not permitted"):
        netns.make_two_hosts(FakeRequest(), "10.250.0", "kfs")


def test_no_other_test_skips():
    found = [
        f"{path.relative_to(TESTS_DIR)}:{number}: {line.strip()}"
        for path in sorted(TESTS_DIR.rglob("*.py"))
        if path.name not in ("netns.py", Path(__file__).name)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SKIP_CALL.search(line)
    ]
    assert not found, "tests that skip (CI runs everything):\n" + "\n".join(found)
