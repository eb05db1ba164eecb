"""``python -m benchmarks.scaling``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.scaling.run import main

sys.argv[0] = "python -m benchmarks.scaling"  # argparse's usage line names the command to type
raise SystemExit(main())
