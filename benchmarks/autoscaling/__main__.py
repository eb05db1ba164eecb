"""``python -m benchmarks.autoscaling``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.autoscaling.run import main

sys.argv[0] = "python -m benchmarks.autoscaling"  # argparse's usage line names the command to type
raise SystemExit(main())
