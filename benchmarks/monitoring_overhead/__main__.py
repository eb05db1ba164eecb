"""``python -m benchmarks.monitoring_overhead``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.monitoring_overhead.run import main

sys.argv[0] = "python -m benchmarks.monitoring_overhead"  # argparse's usage line names the command to type
raise SystemExit(main())
