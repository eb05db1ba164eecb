"""``kungfu-strategy explain --costs``: the cost model's breakdown per variable, with uniform or measured rates.

In-process (``main``), on the registry's small digits MLP (4 variables,
38440 bytes). The expected total is worked out by hand from the options.
"""

from __future__ import annotations

import re

import pytest

from kungfu_tf.strategy.auto.link_rates import LinkRates
from kungfu_tf.strategy.cli import main

MODEL = "digits-mlp"
MODEL_BYTES = 4 * (64 * 128 + 128 + 128 * 10 + 10)  # 38440
ALL_REDUCE = """
graph_config { replicas: 2 }
node_config { var_name: "dense/kernel" all_reduce {} }
node_config { var_name: "dense/bias" all_reduce {} }
node_config { var_name: "dense_1/kernel" all_reduce {} }
node_config { var_name: "dense_1/bias" all_reduce {} }
"""


@pytest.fixture
def strategy_file(tmp_path):
    path = tmp_path / "ar.pbtxt"
    path.write_text(ALL_REDUCE)
    return path


def table_rows(out: str) -> dict[str, list[str]]:
    section = out.split("cost model (ms per iteration)", 1)[1]
    return {cells[0]: cells[1:] for cells in (line.split() for line in section.splitlines()) if len(cells) == 8}


def test_breakdown_with_uniform_rates(strategy_file, capsys):
    assert main(["explain", str(strategy_file), "--model", MODEL, "--np", "2", "--link-gbps", "8", "--latency-us", "100"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("strategy '' for 2 replicas")  # the usual table comes first
    assert "np=2 hosts=0,0; within a host 1.00 GB/s, 100 us (uniform rates)" in out
    rows = table_rows(out)
    assert set(rows) >= {"dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias", "total"}
    # One merge group on 2 workers: each sends the 38440 bytes once at 1 GB/s, 2 hops of 100 us,
    # and on each rank 20 us per tensor plus the optimizer's 4 passes over the model at 4 GB/s.
    expected_ms = (MODEL_BYTES / 1e9 + 2 * 100e-6 + 4 * 20e-6 + 4 * MODEL_BYTES / 4e9) * 1e3
    assert float(rows["total"][-1]) == pytest.approx(expected_ms, abs=1e-3)
    assert sum(float(r[-1]) for name, r in rows.items() if name != "total") == pytest.approx(expected_ms, abs=4e-3)
    assert re.search(r"predicted sync time [\d.]+ ms per iteration; busiest resource: link", out)


def test_breakdown_across_hosts_names_the_host_link(strategy_file, capsys, tmp_path):
    path = tmp_path / "ar4.pbtxt"
    path.write_text(ALL_REDUCE.replace("replicas: 2", "replicas: 4"))
    assert main(["explain", str(path), "--model", MODEL, "--np", "4", "--hosts", "2", "--cross-host-gbps", "1"]) == 0
    out = capsys.readouterr().out
    assert "between hosts 125.00 MB/s" in out
    # The slow way between the hosts bounds the step: a host's interface, or a link from one host to the other.
    busiest = re.search(r"busiest resource: (host \d (in|out)|link (\d)->(\d))$", out.strip())
    assert busiest, out
    if busiest.group(3) is not None:
        assert int(busiest.group(3)) // 2 != int(busiest.group(4)) // 2, busiest.group(0)


def test_breakdown_with_a_rates_file(strategy_file, capsys, tmp_path):
    rates = tmp_path / "rates.json"
    rates.write_text(LinkRates.uniform(2, 5e8, 2e-4).to_json())
    assert main(["explain", str(strategy_file), "--model", MODEL, "--np", "2", "--rates", str(rates)]) == 0
    out = capsys.readouterr().out
    assert "within a host 500.00 MB/s, 200 us (file rates)" in out
    expected_ms = (MODEL_BYTES / 5e8 + 2 * 200e-6 + 4 * 20e-6 + 4 * MODEL_BYTES / 4e9) * 1e3
    assert float(table_rows(out)["total"][-1]) == pytest.approx(expected_ms, abs=1e-3)


def test_rates_of_another_cluster_are_refused(strategy_file, capsys, tmp_path):
    rates = tmp_path / "rates.json"
    rates.write_text(LinkRates.uniform(3, 5e8, 2e-4).to_json())
    assert main(["explain", str(strategy_file), "--model", MODEL, "--np", "2", "--rates", str(rates)]) == 2
    err = capsys.readouterr().err
    assert "link rates describe 3 ranks (np=3 hosts=0,0,0) but the cluster has 2 replicas" in err


def test_costs_need_a_model_and_np(strategy_file, capsys):
    assert main(["explain", str(strategy_file), "--costs"]) == 2
    assert "the cost breakdown needs --model and --np" in capsys.readouterr().err


def test_without_cost_options_the_output_is_unchanged(strategy_file, capsys):
    assert main(["explain", str(strategy_file), "--model", MODEL, "--np", "2"]) == 0
    assert "cost model" not in capsys.readouterr().out


def test_ranks_sharing_one_core_add_up_their_local_work(strategy_file, capsys):
    args = ["explain", str(strategy_file), "--model", MODEL, "--np", "2", "--link-gbps", "8", "--latency-us", "100"]
    assert main([*args, "--cores-per-host", "1"]) == 0
    out = capsys.readouterr().out
    local = 4 * 20e-6 + 4 * MODEL_BYTES / 4e9  # one rank's local work; two ranks on one core take twice as long
    expected_ms = (MODEL_BYTES / 1e9 + 2 * 100e-6 + 2 * local) * 1e3
    assert float(table_rows(out)["total"][-1]) == pytest.approx(expected_ms, abs=1e-3)
