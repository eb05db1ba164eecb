"""Every dependency is pinned: a fresh machine installs what CI tested.

constraints.txt pins every package of .venv (transitive ones included);
the Makefile installs requirements.txt under it, and pyproject.toml's build
requirements (used by an isolated ``pip install .``) match it.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import tomllib

from conftest import REPO_ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9._-]+)==([A-Za-z0-9.+!_-]+)$")


def requirement_lines(path) -> list[str]:
    lines = (REPO_ROOT / path).read_text().splitlines()
    return [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]


def pins() -> dict[str, str]:
    out = {}
    for line in requirement_lines("constraints.txt"):
        m = PIN.match(line)
        assert m, f"constraints.txt: {line!r} is not an exact pin name==version"
        out[canonicalize_name(m.group(1))] = m.group(2)
    return out


def test_every_requirement_is_pinned_within_its_range():
    pinned = pins()
    build = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for text in requirement_lines("requirements.txt") + build:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pinned, f"{req.name} is required but not pinned in constraints.txt"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{text} excludes the pin {pinned[name]}"
    for text in build:
        req = Requirement(text)
        assert str(req.specifier) == f"=={pinned[canonicalize_name(req.name)]}", f"pyproject build requirement {text} is not the pin"


def test_pins_are_closed_under_dependencies_and_installed():
    """Each pinned package's own requirements are pinned too, and .venv holds exactly the pins."""
    pinned = pins()
    for name, version in pinned.items():
        dist = importlib.metadata.distribution(name)
        assert dist.version == version, f"{name}: .venv has {dist.version}, constraints.txt pins {version}"
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an optional extra or another platform
            assert canonicalize_name(req.name) in pinned, f"{name} needs {req.name}, which is not pinned"


def test_makefile_installs_under_the_constraints():
    dry_run = subprocess.run(
        ["make", "-n", "-B", ".venv/.kungfu-deps.stamp"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert re.search(r"pip install -r requirements\.txt -c constraints\.txt$", dry_run, re.MULTILINE), dry_run


def test_the_ray_extra_is_the_pinned_ray():
    """`pip install kungfu_tf[ray]` gets the Ray that `make install` installs and CI tests."""
    extra = re.search(r'^RAY_REQUIREMENT = "ray==([^"]+)"$', (REPO_ROOT / "setup.py").read_text(), re.MULTILINE)
    assert extra, "setup.py has no RAY_REQUIREMENT = \"ray==VERSION\""
    assert extra.group(1) == pins()["ray"], f"setup.py's extra ray=={extra.group(1)} is not the pin ray=={pins()['ray']}"
    assert "ray" in [Requirement(r).name for r in requirement_lines("requirements.txt")]
