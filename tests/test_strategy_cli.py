"""``kungfu-strategy``: explain and build, as users run them (console script) and in-process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO_ROOT, worker_env

from kungfu_tf.strategy import format as strategy_format
from kungfu_tf.strategy.cli import main

SCRIPT = Path(sys.executable).with_name("kungfu-strategy")
MODEL = "digits-mlp"  # small: 64-128-10 MLP, 4 variables

MIXED = textwrap.dedent(
    """\
    id: "hand-written"
    graph_config { replicas: 2 }
    node_config { var_name: "dense/kernel" all_reduce { topology: "RING" compressor: "fp16" } }
    node_config { var_name: "dense/bias" ps { owner: 1 } }
    node_config {
      var_name: "dense_1/kernel"
      partitioner: "2,1"
      part_config { var_name: "dense_1/kernel/part_0" ps { owner: 0 staleness: 3 } }
      part_config { var_name: "dense_1/kernel/part_1" ps { owner: 1 sync: false } }
    }
    node_config { var_name: "dense_1/bias" all_reduce { topology: "RING" } }
    """
)


def run_cli(*args: str, module: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs the installed console script (or ``python -m kungfu_tf.strategy.cli``)."""
    if module or not SCRIPT.exists():
        command = [sys.executable, "-m", "kungfu_tf.strategy.cli"]
    else:
        command = [str(SCRIPT)]
    return subprocess.run(
        command + list(args),
        capture_output=True,
        text=True,
        timeout=300,
        env=worker_env(),
        cwd=REPO_ROOT,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kungfu-strategy: error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def mixed_file(tmp_path: Path) -> Path:
    path = tmp_path / "mixed.pbtxt"
    path.write_text(MIXED)
    return path


# -- explain FILE (no model) ------------------------------------------------------


def test_console_script_is_installed():
    assert SCRIPT.exists(), "run `make install` (or pip install -e .) to create the kungfu-strategy script"


def test_explain_file(mixed_file):
    result = run_cli("explain", str(mixed_file))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("strategy 'hand-written' for 2 replicas: 4 variables, 5 synchronised tensors")
    lines = out.splitlines()
    assert lines[3].split() == ["dense/kernel", "?", "?", "1", "AR", "group", "0", "RING", "fp16", "sync", "?"]
    assert lines[4].split() == ["dense/bias", "?", "?", "1", "PS", "owner", "1", "-", "-", "sync", "?"]
    assert lines[5].split() == ["dense_1/kernel", "?", "?", "2", "(axis", "0)", "PS", "?"]
    assert lines[6].split() == ["part_0", "?", "?", "PS", "owner", "0", "-", "-", "ssp", "K=3"]
    assert lines[7].split() == ["part_1", "?", "?", "PS", "owner", "1", "-", "-", "async"]
    assert "total: 4 variables (1 partitioned into 2 shards), ? bytes" in out
    assert "all-reduce: 2 variables, 2 tensors, ? bytes in 1 group" in out
    assert "parameter servers: 2 variables, 3 tensors, ? bytes over 2 of 2 ranks" in out
    assert "  rank 1: 2 tensors, ? bytes" in out


def test_explain_json_file_via_python_m(mixed_file, tmp_path):
    json_file = tmp_path / "mixed.json"
    strategy_format.save(strategy_format.load(mixed_file), json_file)
    result = run_cli("explain", str(json_file), module=True)
    assert result.returncode == 0, result.stderr
    assert "strategy 'hand-written' for 2 replicas" in result.stdout


def test_explain_without_model_does_not_import_tensorflow(mixed_file):
    code = (
        "import sys\n"
        "from kungfu_tf.strategy.cli import main\n"
        f"assert main(['explain', {str(mixed_file)!r}]) == 0\n"
        "assert 'tensorflow' not in sys.modules, 'explain imported TensorFlow'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=worker_env(), check=False)
    assert result.returncode == 0, result.stderr


def test_explain_malformed_text_file(tmp_path):
    path = tmp_path / "broken.pbtxt"
    path.write_text('id: "x"\nnode_config {\n  var_name: "w"\n  ps { ownr: 1 }\n}\n')
    assert_one_line_error(run_cli("explain", str(path)), f"{path}:4:", "ownr")


def test_explain_malformed_json_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"nodeConfig": [\n  {"varName": "w"\n]}\n')
    assert_one_line_error(run_cli("explain", str(path)), f"{path}:3:", "invalid JSON")


def test_explain_invalid_strategy(tmp_path):
    path = tmp_path / "gap.pbtxt"
    path.write_text(MIXED.replace('compressor: "fp16" }', 'compressor: "fp16" group: 2 }'))
    assert_one_line_error(run_cli("explain", str(path)), str(path), "contiguous 0..2", "1 is missing")


def test_explain_missing_file(tmp_path):
    path = tmp_path / "absent.pbtxt"
    assert_one_line_error(run_cli("explain", str(path)), "cannot read strategy file", str(path))


def test_explain_np_must_match(mixed_file):
    assert_one_line_error(run_cli("explain", str(mixed_file), "--np", "3"),
                          "strategy written for 2 replicas, job has 3")


def test_usage_errors_exit_2():
    result = run_cli("build", "--model", MODEL)
    assert result.returncode == 2
    assert "--builder" in result.stderr
    assert run_cli("explain", "f", "--np", "0").returncode == 2


# -- with a model ---------------------------------------------------------------


def test_explain_with_model(mixed_file):
    result = run_cli("explain", str(mixed_file), "--model", MODEL, "--np", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[3].split()[:5] == ["dense/kernel", "(64,", "128)", "32.0", "KiB"]
    assert lines[5].split()[:4] == ["dense_1/kernel", "(128,", "10)", "5.0"]
    assert lines[6].split()[:6] == ["part_0", "[0:64]", "(64,", "10)", "2.5", "KiB"]
    assert "total: 4 variables (1 partitioned into 2 shards), 37.5 KiB" in result.stdout
    assert "  rank 1: 2 tensors, 3.0 KiB" in result.stdout


def test_explain_with_model_in_process(mixed_file, tmp_path, capsys):
    assert main(["explain", str(mixed_file), "--model", MODEL]) == 0
    assert "dense/bias" in capsys.readouterr().out

    missing = tmp_path / "missing.pbtxt"
    missing.write_text(MIXED.replace('node_config { var_name: "dense_1/bias" all_reduce { topology: "RING" } }', ""))
    assert main(["explain", str(missing), "--model", MODEL]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kungfu-strategy: error: {missing}: ")
    assert "'dense_1/bias'" in err and "no node" in err

    assert main(["explain", str(mixed_file), "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'no-such-model'" in err and MODEL in err

    assert main(["explain", str(mixed_file), "--model", MODEL, "--models-dir", str(tmp_path)]) == 2
    assert "no model registry in" in capsys.readouterr().err


# -- build ----------------------------------------------------------------------


def builder_names() -> list[str]:
    from kungfu_tf.strategy.builders import BUILDERS

    # AutoStrategy runs trial jobs: far too slow for a unit test.
    return sorted(name for name in BUILDERS if "auto" not in name.lower())


def digits_variables():
    sys.path.insert(0, str(REPO_ROOT / "models"))
    import keras
    import registry

    from kungfu_tf.strategy.variable_info import describe_model

    # Layer names are numbered per session: start afresh, as a worker would.
    keras.backend.clear_session()
    return describe_model(registry.MODELS[MODEL].build())


def test_build_writes_a_loadable_file(tmp_path):
    from kungfu_tf.strategy.validation import validate

    name = builder_names()[0]
    out = tmp_path / "built.json"
    result = run_cli("build", "--builder", name, "--model", MODEL, "--np", "4", "--hosts", "2",
                     "--bandwidth-gbps", "10", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    assert out.read_text().lstrip().startswith("{")  # JSON, from the suffix
    strategy = strategy_format.load(out)
    validate(strategy, digits_variables(), replicas=4)


@pytest.mark.parametrize("name", builder_names())
def test_every_builder_through_the_cli(name, tmp_path, capsys):
    from kungfu_tf.strategy.validation import validate

    out = tmp_path / "built.pbtxt"
    assert main(["build", "--builder", name, "--model", MODEL, "--np", "3", "-o", str(out)]) == 0
    validate(strategy_format.load(out), digits_variables(), replicas=3)
    assert main(["explain", str(out), "--model", MODEL, "--np", "3"]) == 0
    assert "total: 4 variables" in capsys.readouterr().out


def test_build_to_stdout_as_json(capsys):
    name = builder_names()[0]
    assert main(["build", "--builder", name, "--model", MODEL, "--np", "2", "--format", "json"]) == 0
    strategy = strategy_format.parse(capsys.readouterr().out, "json")
    assert strategy.graph_config.replicas in (0, 2)
    assert len(strategy.node_config) == 4


def test_build_errors(capsys):
    assert main(["build", "--builder", "NoSuchBuilder", "--model", MODEL, "--np", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kungfu-strategy: error: unknown builder 'NoSuchBuilder'; choose one of: ")
    assert builder_names()[0] in err
    assert main(["build", "--builder", builder_names()[0], "--model", MODEL, "--np", "2", "--hosts", "3"]) == 2
    assert "cannot spread 2 replicas over 3 hosts" in capsys.readouterr().err
