"""``python -m benchmarks.frame_auth``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.frame_auth.run import main

sys.argv[0] = "python -m benchmarks.frame_auth"  # argparse's usage line names the command to type
raise SystemExit(main())
