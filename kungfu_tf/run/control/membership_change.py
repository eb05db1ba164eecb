"""One line per committed cluster version, as the elastic launcher prints it.

Example:
    >>> describe_change(3, ["h:1", "h:2"], ["h:1"], "lost h:2: killed by SIGKILL")
    'cluster v3: 2 -> 1 workers (lost h:2: killed by SIGKILL)'
    >>> describe_change(4, ["h:1"], ["h:1", "h:5"], None)
    'cluster v4: 1 -> 2 workers (joined h:5)'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# What the config service records for a commit made with PutCluster: it says
# nothing about who left, so the launcher describes the difference instead.
_UNINFORMATIVE_REASONS = ("", "put_cluster")


def describe_change(
    version: int,
    old: Sequence[str],
    new: Sequence[str],
    reason: str | None,
    known_exits: Mapping[str, str] | None = None,
) -> str:
    """``cluster v<version>: <old size> -> <new size> workers (<why>)``.

    ``reason`` is the config service's record of why the version was
    committed (only the serving launcher can read it); without one, the
    difference is described: ``lost X: <cause>`` for workers whose death
    this launcher saw (``known_exits``: peer -> cause), ``left X`` for the
    other departures, ``joined Y`` for arrivals.
    """
    if reason is None or reason in _UNINFORMATIVE_REASONS:
        reason = _difference(old, new, known_exits or {})
    return f"cluster v{version}: {len(old)} -> {len(new)} workers ({reason})"


def workers_text(count: int) -> str:
    """``1 worker``, ``3 workers``."""
    return f"{count} worker" if count == 1 else f"{count} workers"


def _difference(old: Sequence[str], new: Sequence[str], known_exits: Mapping[str, str]) -> str:
    gone = [p for p in old if p not in new]
    parts = [f"lost {p}: {known_exits[p]}" for p in gone if p in known_exits]
    left = [p for p in gone if p not in known_exits]
    if left:
        parts.append("left " + ", ".join(left))
    joined = [p for p in new if p not in old]
    if joined:
        parts.append("joined " + ", ".join(joined))
    return "; ".join(parts) or "same workers in a new order"
