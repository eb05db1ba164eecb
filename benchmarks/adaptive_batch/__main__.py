"""``python -m benchmarks.adaptive_batch``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.adaptive_batch.run import main

sys.argv[0] = "python -m benchmarks.adaptive_batch"  # argparse's usage line names the command to type
raise SystemExit(main())
