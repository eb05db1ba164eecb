"""Where the benchmarks find the repository and put what they write.

Example:
    >>> from benchmarks.harness.paths import BUILD_DIR, REPO
    >>> BUILD_DIR.relative_to(REPO).as_posix()
    'build/bench'
"""

from __future__ import annotations

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parents[1]
REPO = BENCH_DIR.parent
# Raw results (JSON) of the last run of each benchmark; not tracked.
BUILD_DIR = REPO / "build" / "bench"
# Logs and tables kept with the repository (docs/guide/benchmarks.md quotes them).
RESULTS_DIR = BENCH_DIR / "results"
