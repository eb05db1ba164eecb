"""``python -m benchmarks.listing_one``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.listing_one.run import main

sys.argv[0] = "python -m benchmarks.listing_one"  # argparse's usage line names the command to type
raise SystemExit(main())
