"""The guide's API table (docs/guide/api.md) lists only what ``kungfu_tf.ops`` really exports.

The table under ``| `kungfu_tf.ops` |`` names functions users call as
``ops.NAME``; each must be in ``kungfu_tf/ops/__init__.py``'s ``__all__``
(read from the source, so nothing here imports TensorFlow).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_ops_names() -> set[str]:
    """Function names in the first column of the guide's ``kungfu_tf.ops`` table."""
    lines = (ROOT / "docs" / "guide" / "api.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `kungfu_tf.ops` |"))
    names: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        first_column = line.split("|")[1]
        names |= set(re.findall(r"`?([a-z_]+)\(", first_column))
    return names


def exported_ops_names() -> set[str]:
    tree = ast.parse((ROOT / "kungfu_tf" / "ops" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("kungfu_tf/ops/__init__.py has no __all__")


def test_readme_table_is_parsed():
    names = readme_ops_names()
    assert {"all_reduce", "push_rows", "request_rows", "comm_bytes"} <= names, sorted(names)


def test_every_op_the_readme_lists_is_exported():
    missing = readme_ops_names() - exported_ops_names()
    assert not missing, f"docs/guide/api.md lists under kungfu_tf.ops but kungfu_tf.ops does not export: {sorted(missing)}"
