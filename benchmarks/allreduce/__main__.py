"""``python -m benchmarks.allreduce``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.allreduce.run import main

sys.argv[0] = "python -m benchmarks.allreduce"  # argparse's usage line names the command to type
raise SystemExit(main())
