"""``python -m benchmarks.etcd_security``: runs the experiment's driver (run.py)."""

import sys

from benchmarks.etcd_security.run import main

sys.argv[0] = "python -m benchmarks.etcd_security"  # argparse's usage line names the command to type
raise SystemExit(main())
