"""The package's layers (DESIGN.md): nothing imports upward, and no two modules import each other.

Imports are read from the source (every ``import`` statement, those inside
functions too), so nothing here imports TensorFlow.

    user API        kungfu_tf.{optimizers,keras,v1,policy,elastic,data,variables}
    strategy        kungfu_tf.strategy
    ops             kungfu_tf.ops
    bottom          kungfu_tf._native, kungfu_tf.proto, kungfu_tf.run (launcher,
                    config service and the worker environment they define)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "kungfu_tf"
LAYERS = {  # top-level subpackage/module -> layer (higher may import lower)
    "_native": 0, "proto": 0, "run": 0,
    "ops": 1,
    "strategy": 2,
    "optimizers": 3, "keras": 3, "v1": 3, "policy": 3, "elastic": 3, "data": 3, "variables": 3,
}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py")) if "proto" not in p.parts[-2:-1]}


def imports_of(name: str, path: Path) -> set[str]:
    """kungfu_tf modules ``path`` imports (``from kungfu_tf.x import y`` counts as x.y if that is a module)."""
    known = modules()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in found if m.startswith("kungfu_tf.")}


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def edges() -> dict[str, set[str]]:
    return {name: imports_of(name, path) for name, path in modules().items()}


def test_every_part_of_the_package_has_a_layer():
    assert not [m for m in modules() if m != "kungfu_tf" and layer(m) is None]


def test_nothing_imports_upward():
    upward = [
        f"{src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})"
        for src, dsts in edges().items()
        for dst in sorted(dsts)
        if layer(src) is not None and layer(dst) is not None and layer(dst) > layer(src)
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("subpackage", ["optimizers", "strategy", "ops", "run"])
def test_no_two_modules_import_each_other(subpackage):
    graph = edges()
    packages = {name for name, path in modules().items() if path.name == "__init__.py"}
    mutual = sorted(
        f"{a} <-> {b}"
        for a, dsts in graph.items()
        for b in dsts
        if a < b and a.startswith(f"kungfu_tf.{subpackage}.") and a in graph.get(b, set())
        and not {a, b} & packages
    )
    assert not mutual, "\n".join(mutual)
