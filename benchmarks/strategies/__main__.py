"""``python -m benchmarks.strategies``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.strategies.run import main

sys.argv[0] = "python -m benchmarks.strategies"  # argparse's usage line names the command to type
raise SystemExit(main())
