"""Parsing and human-readable formatting of sizes, times and rates.

Sizes are binary (KiB, MiB) because tensor sizes are powers of two; rates
are decimal (GB/s = 1e9 B/s), the convention of nccl-tests' bus bandwidth.
"""

from __future__ import annotations

import re

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_SIZE_SHIFT = {"": 0, "K": 10, "M": 20, "G": 30}


def parse_size(text: str) -> int:
    """Parses ``4``, ``1K``, ``64KiB``, ``16M``, ``1MiB`` ... into bytes."""
    m = _SIZE_RE.match(text)
    if m is None:
        raise ValueError(f"bad size {text!r} (examples: 4, 1K, 64KiB, 16M)")
    return int(m.group(1)) << _SIZE_SHIFT[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """``4 B``, ``1 KiB``, ``64 MiB``; exact multiples use the larger unit."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def _three_digits(value: float) -> str:
    """Three significant digits without switching to exponent notation."""
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_time(seconds: float) -> str:
    """``812 µs``, ``3.41 ms``, ``1.20 s``."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{_three_digits(seconds / scale)} {unit}"
    return f"{_three_digits(seconds / 1e-9)} ns"


def format_rate(bytes_per_s: float) -> str:
    """``1.08 GB/s``, ``412 MB/s``, ``9.71 KB/s`` (decimal units)."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{_three_digits(bytes_per_s / scale)} {unit}"
    return f"{_three_digits(bytes_per_s)} B/s"


def format_ratio(ratio: float) -> str:
    """``0.52×``, ``13.4×``, ``812×``."""
    return f"{_three_digits(ratio)}×"
