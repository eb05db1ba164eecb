"""``python -m benchmarks.config_store``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.config_store.run import main

sys.argv[0] = "python -m benchmarks.config_store"  # argparse's usage line names the command to type
raise SystemExit(main())
