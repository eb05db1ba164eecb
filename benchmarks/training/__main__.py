"""``python -m benchmarks.training``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.training.run import main

sys.argv[0] = "python -m benchmarks.training"  # argparse's usage line names the command to type
raise SystemExit(main())
