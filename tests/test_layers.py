"""The package's layers (DESIGN.md): nothing imports upward, and no module imports itself back.

Imports are read from the source (every ``import`` statement, those inside
functions too), so nothing here imports TensorFlow.

A circle is a chain of imports that leads from a module back to itself,
inside one package or across packages. Every import statement counts: one
inside a function (it runs when the function does) and one under
``if TYPE_CHECKING:`` too. A type-only import does not run, but it is the
same dependency for a reader (to know what ``ctx`` is you must read the
other module), and a circle of annotations is the coupling that keeps two
files from being understood, tested or moved apart (the way a Keras
``Callback`` receives the model and imports nothing of the trainer). What
does not count is the parent package Python imports before a submodule:
``kungfu_tf.policy.runner`` is not in a circle with ``kungfu_tf.policy``
unless it imports the package itself (``from kungfu_tf.policy import X``).

    user API        kungfu_tf.{optimizers,keras,v1,policy,elastic,data,variables}
    strategy        kungfu_tf.strategy
    ops             kungfu_tf.ops
    bottom          kungfu_tf._native, kungfu_tf.proto, kungfu_tf.run (launcher,
                    config service and the worker environment they define)

Inside ``kungfu_tf.run`` the sub-packages are layered too (RUN_LAYERS):

    launch/       kungfu-run's entry point, the static and elastic supervisors
    providers/    where workers run: local processes (output relay), Ray actors, joiners
    plan/         command line -> job plan (options, ports, hosts, topology)
    control/      config service, job state, watcher     worker_env/  KUNGFU_* variables
    errors.py     LaunchError
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


RUN_LAYERS = {  # kungfu_tf.run sub-package (or module at its root) -> layer (higher may import lower)
    "errors": 0,
    "worker_env": 1, "control": 1,
    "plan": 2,
    "providers": 3,
    "launch": 4,
}  # fmt: skip
RUN_TOP = 5  # the package itself, __main__ and the deprecated modules left at the old paths


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


def run_layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) < 3:
        return RUN_TOP
    path = PACKAGE_DIR / "run" / parts[2]
    return RUN_LAYERS[parts[2]] if parts[2] in RUN_LAYERS else RUN_TOP if path.with_suffix(".py").is_file() else -1


def test_every_part_of_run_has_a_layer():
    assert not [m for m in modules() if m.startswith("kungfu_tf.run.") and run_layer(m) < 0]


def test_run_subpackages_import_only_downward():
    """A sub-package of kungfu_tf.run imports only those below it, never a sibling of its own layer."""
    run = [m for m in modules() if m == "kungfu_tf.run" or m.startswith("kungfu_tf.run.")]
    graph = edges()

    def part(m: str) -> str:
        return m.split(".")[2] if len(m.split(".")) > 2 else ""

    upward = [
        f"{src} (layer {run_layer(src)}) imports {dst} (layer {run_layer(dst)})"
        for src in run
        for dst in sorted(graph[src])
        if dst.startswith("kungfu_tf.run.") and part(src) != part(dst) and run_layer(dst) >= run_layer(src)
        and run_layer(src) != RUN_TOP
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


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of ``graph`` with more than one module (or a module importing itself), sorted.

    Tarjan's algorithm, iterative (a deep chain of imports must not hit the recursion limit).

    Example:
        >>> circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
        [['a', 'b', 'c']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root), on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in graph:
                    continue
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target), on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1 or node in graph[node]:
                        found.append(sorted(part))
    return sorted(found)


def a_cycle(graph: dict[str, set[str]], part: list[str]) -> list[str]:
    """The shortest chain of imports from ``part[0]`` back to itself (breadth first), for the error message."""
    members, start = set(part), part[0]
    came_from: dict[str, str] = {}
    queue = [start]
    for node in queue:
        for target in sorted(graph[node] & members):
            if target == start:
                chain = [node]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [*reversed(chain), start]
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{part} is not a circle")


def test_circles_finds_a_circle_and_names_it():
    graph = {"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a", "q.d"}, "q.d": set(), "q.e": {"q.e"}}
    assert circles(graph) == [["p.a", "p.b", "p.c"], ["q.e"]]
    assert a_cycle(graph, ["p.a", "p.b", "p.c"]) == ["p.a", "p.b", "p.c", "p.a"]


def test_no_import_circle_anywhere_in_the_package():
    graph = edges()
    found = [" -> ".join(a_cycle(graph, part)) for part in circles(graph)]
    assert not found, "import circles (TYPE_CHECKING and function-level imports count):\n" + "\n".join(found)
