"""``python -m benchmarks.auto_probe``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.auto_probe.run import main

sys.argv[0] = (
    "python -m benchmarks.auto_probe"  # argparse's usage line names the command to type
)
raise SystemExit(main())
