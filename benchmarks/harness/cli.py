"""Command-line pieces the benchmark drivers share.

Example:
    >>> import argparse
    >>> comma_choices(argparse.ArgumentParser(), "--models", "a, b", ("a", "b", "c"))
    ['a', 'b']
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def comma_choices(
    parser: argparse.ArgumentParser,
    option: str,
    text: str,
    choices: Sequence[str],
    allow_all: bool = True,
) -> list[str]:
    """The comma-separated ``text`` of ``option`` as a list, each checked against ``choices``.

    ``all`` (if ``allow_all``) stands for every choice; anything unknown is
    a ``parser.error`` naming it and the valid values.
    """
    if allow_all and text == "all":
        return list(choices)
    values = [v.strip() for v in text.split(",")]
    for v in values:
        if v not in choices:
            also = " or 'all'" if allow_all else ""
            parser.error(
                f"{option}: unknown {v!r}; choose from {','.join(choices)}{also}"
            )
    return values
