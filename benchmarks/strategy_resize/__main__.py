"""``python -m benchmarks.strategy_resize``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.strategy_resize.run import main

sys.argv[0] = "python -m benchmarks.strategy_resize"  # argparse's usage line names the command to type
raise SystemExit(main())
