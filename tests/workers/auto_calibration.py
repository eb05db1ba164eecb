"""Worker for tests/test_auto_calibration.py: calibrate the links of the running job, twice.

Usage: auto_calibration.py CACHE_DIR [mismatch]

The first call probes (no cache yet), the second must be answered from the
cache rank 0 wrote, the third (refresh) probes again. Each prints
``rates ORIGIN JSON`` so the test can compare workers; every measured rate
must be positive and finite, and the cached answer must equal the probed one.
Ends with "checked N results".

With ``mismatch`` every rank probes with a blob of another size, so each
rank's fetch of its peer's blob fails: every rank must raise StrategyError
(printed as ``failed: MESSAGE``), and none may hang.
"""

from __future__ import annotations

import math
import sys

import _setup  # noqa: F401  (TensorFlow threads)

from kungfu_tf import ops
from kungfu_tf.strategy.auto.calibration import calibrate
from kungfu_tf.strategy.errors import StrategyError

cache_dir = sys.argv[1]
checks = 0
if sys.argv[2:] == ["mismatch"]:
    try:
        calibrate(cache_dir=cache_dir, refresh=True, probe_bytes=(1 << 16) * (1 + int(ops.rank())), repeats=1)
    except StrategyError as e:
        print("failed:", " ".join(str(e).split()), flush=True)
        print("checked 1 results", flush=True)
    sys.exit(0)
first = calibrate(cache_dir=cache_dir, probe_bytes=1 << 20, repeats=2)
second = calibrate(cache_dir=cache_dir, probe_bytes=1 << 20, repeats=2)
third = calibrate(cache_dir=cache_dir, refresh=True, probe_bytes=1 << 20, repeats=2)
for rates in (first, second, third):
    print("rates", rates.origin, rates.to_json(), flush=True)
    n = rates.replicas
    for i in range(n):
        for j in range(n):
            if i != j:
                assert rates.bandwidth[i][j] > 0 and math.isfinite(rates.bandwidth[i][j]), rates.bandwidth
                assert rates.latency[i][j] > 0 and math.isfinite(rates.latency[i][j]), rates.latency
                checks += 2
assert (first.origin, second.origin, third.origin) == ("probe", "cache", "probe"), (first.origin, second.origin)
assert second == first, "the cache must return what the probe measured"
checks += 2
print(f"checked {checks} results", flush=True)
