"""The benchmark's Open MPI anchor (benchmarks/allreduce/mpi_allreduce.c) is itself correct.

``make bench`` compares our all-reduce with Open MPI's ``MPI_Allreduce``; a
wrong anchor would make that comparison meaningless. The program is built
and started exactly as the benchmark does it (benchmarks/allreduce/mpi.py), and
its result at np=2 is checked against numpy. Open MPI is a system package
that ``make sysdeps`` installs, so its absence is a failure, not a skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.allreduce import mpi as bench_mpi
from benchmarks.allreduce.report import MPI_COLUMN, allreduce_tables
from benchmarks.harness.proc import run_group
from benchmarks.harness.timing import parse_results

NP = 2
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def mpi_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mpi_allreduce compiled with mpicc, as the benchmark compiles it."""
    reason = bench_mpi.missing_tool()
    if reason is not None:
        pytest.fail(
            f"Open MPI is needed to verify the benchmark's MPI anchor: {reason}"
        )
    return bench_mpi.build(tmp_path_factory.mktemp("mpi_build"))


def run_mpi(program: Path, args: list[str]) -> list[str]:
    """Runs ``program args`` under the benchmark's mpirun command line; its output lines."""
    (res,) = run_group([bench_mpi.mpirun_argv(NP, program, args)], timeout_s=TIMEOUT_S)
    assert res.ok, f"mpirun exit status {res.returncode}:\n{res.tail()}"
    return res.lines


def test_allreduce_sum_matches_numpy(mpi_program: Path, tmp_path: Path) -> None:
    # An odd length, and values of both signs and different scales per rank.
    rng = np.random.default_rng(10)
    inputs = [
        (rng.standard_normal(1037) * 10.0 ** (2 * r)).astype(np.float32)
        for r in range(NP)
    ]
    for r, x in enumerate(inputs):
        x.tofile(tmp_path / f"in.{r}")

    run_mpi(mpi_program, ["verify", str(tmp_path / "in"), str(tmp_path / "out")])

    # Two float32 operands: a + b is the same correctly rounded value in
    # either order, so the match is exact.
    expected = inputs[0] + inputs[1]
    for r in range(NP):
        got = np.fromfile(tmp_path / f"out.{r}", dtype=np.float32)
        np.testing.assert_array_equal(got, expected, err_msg=f"rank {r}")


def test_timing_mode_reports_what_the_benchmark_reads(mpi_program: Path) -> None:
    sizes, repeats, max_iters = [4, 4096], 3, 10
    lines = run_mpi(
        mpi_program,
        ["time", ",".join(map(str, sizes)), str(repeats), "0.01", str(max_iters), "4"],
    )
    records = parse_results(lines)
    assert [r["size"] for r in records] == sizes, lines
    for r in records:
        assert (r["impl"], r["topology"], r["np"]) == ("mpi", "MPI", NP)
        assert r["iters"] >= 1 and r["iters"] <= max_iters, r
        assert len(r["samples_s"]) == repeats
        assert all(0 < s < TIMEOUT_S for s in r["samples_s"])


def test_table_says_why_mpi_was_not_run() -> None:
    kungfu = {
        "impl": "kungfu",
        "topology": "AUTO",
        "np": 2,
        "size": 4,
        "median_s": 1e-3,
        "busbw": 4e3,
    }
    table = allreduce_tables(
        [kungfu], [2], [4], ["AUTO"], False, True, "mpirun not found"
    )
    header, _, row = table.splitlines()[-3:]
    assert MPI_COLUMN in header
    assert "not run: mpirun not found" in row
    assert row.endswith("| – |")  # no ratio without an MPI time


def test_table_ratio_is_ours_over_mpi() -> None:
    point = {"np": 2, "size": 4, "busbw": 4e3}
    kungfu = {**point, "impl": "kungfu", "topology": "AUTO", "median_s": 1e-3}
    mpi = {**point, "impl": "mpi", "topology": "MPI", "median_s": 4e-6}
    table = allreduce_tables([kungfu, mpi], [2], [4], ["AUTO"], False, True)
    assert table.splitlines()[-1].endswith("| 250× |")
