"""The elastic state digest computed independently of the runtime (tests only).

XXH3-128 by the system's libxxhash (the shared library libxxhash-dev
installs, Makefile sysdeps; the runtime compiles xxHash's header itself)
over the layout of ops/runtime/state_pieces.h: the bytes cut every 4 MiB,
then XXH3-128 over the byte count (8 bytes, little endian) and the pieces'
digests.

Example:
    >>> xxh3_128(b"abc").hex()
    '06b05ab6733a618578af5f94892f3950'
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np

PIECE = 4 << 20


class _Xxh128(ctypes.Structure):
    _fields_ = [("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64)]


@functools.cache
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(ctypes.util.find_library("xxhash") or "libxxhash.so.0")
    lib.XXH3_128bits.restype = _Xxh128
    lib.XXH3_128bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    return lib


def xxh3_128(data: bytes) -> bytes:
    """XXH3-128 (seed 0) of ``data`` in xxHash's canonical form: high 64 bits first, big endian."""
    h = _library().XXH3_128bits(data, len(data))
    return h.high64.to_bytes(8, "big") + h.low64.to_bytes(8, "big")


def reference_digest(arrays: list[np.ndarray]) -> bytes:
    """The digest state_sync must give variables holding ``arrays``, in order."""
    data = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
    pieces = b"".join(xxh3_128(data[i : i + PIECE]) for i in range(0, len(data), PIECE))
    return xxh3_128(len(data).to_bytes(8, "little") + pieces)
