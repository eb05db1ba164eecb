"""Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/).

One valid input per frame kind for fuzz_frame (a FrameHeader, key, payload
as ops/runtime/frame.h lays them out), client hellos for fuzz_handshake
(handshake.h's wire protocol, with a MAC the fuzzer cannot know) and
hostile-writer scripts for fuzz_shm_ring (its header comment has the format). Run from
anywhere: ``python3 tests/fuzz/make_seeds.py``.
"""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
MAGIC = 0x4B46544D
FLOAT32, INT64 = 6, 3
COLLECTIVE, ABORT, REQUEST, RESPONSE, PING, PONG, PUSH, PUSH_ROWS, GOODBYE = range(1, 10)
AT_LEAST, ROWS = 2, 8


def frame(kind, key=b"", payload=b"", dtype=0, flags=0, seq=0, dims=(), version=0, payload_len=None):
    """Header (struct FrameHeader, 104 bytes, little-endian) + key + payload.

    payload_len: what the header claims, if not len(payload) (a lying peer).
    """
    padded = list(dims) + [0] * (8 - len(dims))
    header = struct.pack("<IBBBBIIQQII8q", MAGIC, kind, dtype, 0, flags, version, len(key),
                         len(payload) if payload_len is None else payload_len, seq, len(dims), 0, *padded)
    assert len(header) == 104
    return header + key + payload


def floats(*xs):
    return struct.pack(f"<{len(xs)}f", *xs)


FRAMES = {
    "collective_piece": frame(COLLECTIVE, b"grad#0r@1", floats(1, 2, 3, 4), FLOAT32, seq=1, dims=(4,)),
    "abort": frame(ABORT, b"grad", b"shapes differ", flags=1, seq=1),
    "request": frame(REQUEST, b"blob", b"req#1#0", seq=1),
    "request_latest": frame(REQUEST, b"blob", b"req#1#1", seq=2**64 - 1),
    "request_at_least": frame(REQUEST, b"blob", b"req#1#2", flags=AT_LEAST, seq=2),
    "request_missing": frame(REQUEST, b"nothing", b"req#1#3", seq=1),
    "request_rows": frame(REQUEST, b"table", b"req#1#4", flags=AT_LEAST | ROWS, seq=1, dims=(0,)),
    "response": frame(RESPONSE, b"req#0#0", floats(5, 6), FLOAT32, seq=1),
    "push": frame(PUSH, b"acc", floats(1, 2, 3), FLOAT32, dims=(3,)),
    "push_rows": frame(PUSH_ROWS, b"tacc", struct.pack("<q", 1) + floats(7, 8), FLOAT32, seq=1, dims=(4, 2)),
    "ping": frame(PING, seq=7),
    "goodbye": frame(GOODBYE),
    # Regressions: each made a worker allocate what the header claims
    # (~1 PiB; 2**61 row indices) and abort before the fix.
    "crash_push_huge_payload_len": frame(PUSH, b"acc", floats(1, 2, 3), FLOAT32, dims=(3,), payload_len=2**50),
    "crash_push_rows_wrapping_count": frame(PUSH_ROWS, b"tacc", b"", FLOAT32, seq=2**61, dims=(4, 0)),
}


def client_hello(job=b"fuzz-job", version=3, peer_id=b"127.0.0.1:10001", flags=0):
    ctx = struct.pack(">III", version, flags, len(job)) + job
    return b"KFAUTHC3" + bytes(range(16)) + ctx + struct.pack(">I", len(peer_id)) + peer_id + bytes(32)


HANDSHAKES = {
    "client_hello": client_hello(),
    "other_job": client_hello(job=b"old-run"),
    "other_version": client_hello(version=2),
    "frame_auth": client_hello(flags=1),
    "magic_only": b"KFAUTHC3",
}


def ring_write(data):
    """fuzz_shm_ring step: the writer puts `data` into the ring honestly."""
    return bytes([0]) + struct.pack("<Q", len(data)) + data


def ring_store(op, value):
    """fuzz_shm_ring step: scribble `value` over a control word (1 tail, 2 head, 3 magic/capacity)."""
    return bytes([op]) + struct.pack("<Q", value)


RING_SCRIPTS = {
    "frames": ring_write(FRAMES["collective_piece"] + FRAMES["push"]) + ring_write(FRAMES["goodbye"]),
    # A frame larger than the ring (4 KiB), written in two steps.
    "wrapping_frame": ring_write(frame(PUSH, b"acc", bytes(3000), FLOAT32))
    + ring_write(frame(PUSH, b"acc", bytes(3000), FLOAT32)),
    "tail_past_capacity": ring_write(FRAMES["ping"]) + ring_store(1, 2**20),
    "tail_behind_reader": ring_write(FRAMES["ping"]) + ring_store(1, 0) + ring_write(FRAMES["ping"]),
    "head_ahead_of_writer": ring_store(2, 5000) + ring_write(FRAMES["ping"]),
    "capacity_scribbled": ring_store(3, 2**40 + 1) + ring_write(FRAMES["ping"]),
}


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("fuzz_frame", FRAMES)
    write("fuzz_handshake", HANDSHAKES)
    write("fuzz_shm_ring", RING_SCRIPTS)
