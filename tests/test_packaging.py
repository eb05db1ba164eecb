"""A regular (non-editable) install works outside the source tree.

``pip install --target`` puts the package (built from this checkout, against
.venv's TensorFlow, reusing the object cache) in a temporary directory; the
commands then run from there, with the source tree off ``sys.path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(REPO_ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    return target


def run_installed(target, code: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUNGFU_")}
    env["PYTHONPATH"] = str(target)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


def test_strategy_build_with_a_model_from_an_install(installed, tmp_path):
    out = tmp_path / "built.json"
    code = (
        "import sys, kungfu_tf; from kungfu_tf.strategy.cli import main;"
        "print('from', kungfu_tf.__file__);"
        f"sys.exit(main(['build', '--builder', 'AllReduce', '--model', 'digits-mlp', '--np', '2', '-o', {str(out)!r}]))"
    )
    res = run_installed(installed, code, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"from {installed}" in res.stdout  # not the source tree
    strategy = json.loads(out.read_text())
    assert len(strategy["nodeConfig"]) == 4  # digits-mlp: two Dense layers, kernel and bias each
