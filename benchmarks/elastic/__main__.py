"""``python -m benchmarks.elastic``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.elastic.run import main

sys.argv[0] = "python -m benchmarks.elastic"  # argparse's usage line names the command to type
raise SystemExit(main())
