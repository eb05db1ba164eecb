"""benchmarks/harness/port_block.py: the --port-range the multi-launcher tests give kungfu-run.

The etcd launcher tests once took a range from pid arithmetic that could fall
in the ephemeral range, where an outgoing connection held a port of it: one
launcher refused to start ("port ... is already in use") and the other waited
for its members until the test timed out (a rare CI failure of
test_leader_killed_while_a_joiner_is_admitted).
"""

from __future__ import annotations

import random
import socket

from benchmarks.harness import port_block
from benchmarks.harness.port_block import ephemeral_range, free_port_block

HOSTS = ("127.0.0.1", "127.0.0.2")


def test_a_block_is_below_the_ephemeral_range_and_binds_on_every_host():
    first = free_port_block(41, hosts=HOSTS)
    if ephemeral_range()[0] - 41 > port_block.LOWEST_PORT:  # else any free block (the test below)
        assert port_block.LOWEST_PORT <= first and first + 41 <= ephemeral_range()[0]
    for host in HOSTS:
        listeners = []
        try:
            for port in range(first, first + 41):  # all at once: no port is another's
                s = socket.socket()
                listeners.append(s)
                s.bind((host, port))
                s.listen()
        finally:
            for s in listeners:
                s.close()


def test_a_port_held_by_a_connection_is_never_handed_out(monkeypatch):
    """A connected socket (as an outgoing connection's source port) on one port of the first
    pick, on the second host only: the pick is refused and the next one is returned."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    free = free_port_block(10, hosts=HOSTS)
    busy = free
    while abs(busy - free) < 10:
        busy = free_port_block(10, hosts=HOSTS)
    client = socket.socket()
    client.bind(("127.0.0.2", busy + 3))
    client.connect(server.getsockname())
    picks = iter([busy, free])
    monkeypatch.setattr(random.Random, "randrange", lambda self, low, high: next(picks))
    try:
        assert free_port_block(10, hosts=HOSTS) == free
    finally:
        client.close()
        server.close()


def test_an_ephemeral_range_starting_low_still_gives_a_free_block(monkeypatch, tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024\t65000\n")
    monkeypatch.setattr(port_block, "EPHEMERAL_RANGE_FILE", ranges)
    assert ephemeral_range() == (1024, 65000)
    first = free_port_block(5)
    assert 1024 <= first <= 65536 - 5
