"""``python -m benchmarks.strategy_policy``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.strategy_policy.run import main

sys.argv[0] = "python -m benchmarks.strategy_policy"  # argparse's usage line names the command to type
raise SystemExit(main())
