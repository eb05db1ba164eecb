"""``python -m benchmarks.adaptive_topology``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.adaptive_topology.run import main

sys.argv[0] = "python -m benchmarks.adaptive_topology"  # argparse's usage line names the command to type
raise SystemExit(main())
