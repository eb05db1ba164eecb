"""Slurm's compressed host lists and task counts, expanded.

Slurm hands a job step its nodes as a compressed host list
(``SLURM_STEP_NODELIST=node[01-03,7],login``) and the number of tasks on
each of them run-length encoded (``SLURM_STEP_TASKS_PER_NODE=2(x3),1``).
Both are expanded here in Slurm's order, which is the order of the step's
nodes (node 0 first).

Example:
    >>> expand_hostlist("node[01-03,7],login", "SLURM_STEP_NODELIST")
    ['node01', 'node02', 'node03', 'node7', 'login']
    >>> expand_tasks_per_node("2(x3),1", "SLURM_STEP_TASKS_PER_NODE")
    [2, 2, 2, 1]
"""

from __future__ import annotations

import itertools
import re

from kungfu_tf.run.worker_env.worker_env import WorkerEnvError

_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TASKS = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
# More hosts than any cluster has: a typo such as node[1-9999999] must fail
# with a message, not expand into millions of strings.
MAX_HOSTS = 1_000_000


def _split_top_level(text: str, variable: str, value: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
            if depth > 1:
                raise WorkerEnvError(f"{variable}={value!r}: nested '[' at offset {i}")
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise WorkerEnvError(f"{variable}={value!r}: ']' without '[' at offset {i}")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise WorkerEnvError(f"{variable}={value!r}: '[' is never closed")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str, variable: str, value: str) -> list[str]:
    """``01-03,7`` -> ``['01', '02', '03', '7']`` (the low bound's width is kept)."""
    numbers: list[str] = []
    for item in body.split(","):
        m = _RANGE.fullmatch(item)
        if m is None:
            raise WorkerEnvError(f"{variable}={value!r}: bad range {item!r} in [{body}], expected N or N-M")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise WorkerEnvError(f"{variable}={value!r}: range {item!r} ends before it starts")
        if int(high) - int(low) + len(numbers) >= MAX_HOSTS:
            raise WorkerEnvError(f"{variable}={value!r}: more than {MAX_HOSTS} hosts")
        numbers.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return numbers


def expand_hostlist(value: str, variable: str) -> list[str]:
    """The host names of a Slurm host list, in order.

    Each ``[...]`` holds numbers and ranges; a name with several brackets
    (``rack[1-2]-n[1-2]``) expands to every combination, the leftmost
    bracket varying slowest.

    Raises:
        WorkerEnvError: naming ``variable`` and ``value`` if the list is
            empty or malformed (unbalanced brackets, a bad range).
    """
    hosts: list[str] = []
    for name in _split_top_level(value, variable, value):
        if not name:
            raise WorkerEnvError(f"{variable}={value!r}: empty host name")
        # Literal pieces at even positions, bracket bodies at odd ones.
        pieces = re.split(r"\[([^\]]*)\]", name)
        choices = [[p] if i % 2 == 0 else _expand_ranges(p, variable, value) for i, p in enumerate(pieces)]
        hosts.extend("".join(combination) for combination in itertools.product(*choices))
        if len(hosts) > MAX_HOSTS:
            raise WorkerEnvError(f"{variable}={value!r}: more than {MAX_HOSTS} hosts")
    return hosts


def expand_tasks_per_node(value: str, variable: str) -> list[int]:
    """Tasks per node from Slurm's ``N(xM)`` run-length encoding.

    Raises:
        WorkerEnvError: naming ``variable`` and ``value`` if an item is not
            ``N`` or ``N(xM)`` with N >= 1, M >= 1.
    """
    counts: list[int] = []
    for item in value.split(","):
        m = _TASKS.fullmatch(item)
        if m is None or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise WorkerEnvError(f"{variable}={value!r}: bad item {item!r}, expected N or N(xM) with N, M >= 1")
        repeat = int(m.group(2) or 1)
        if repeat + len(counts) > MAX_HOSTS:
            raise WorkerEnvError(f"{variable}={value!r}: more than {MAX_HOSTS} nodes")
        counts.extend([int(m.group(1))] * repeat)
    return counts
