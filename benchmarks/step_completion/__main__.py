"""``python -m benchmarks.step_completion``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.step_completion.run import main

sys.argv[0] = "python -m benchmarks.step_completion"  # argparse's usage line names the command to type
raise SystemExit(main())
