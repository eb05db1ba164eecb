"""``python -m benchmarks.cost_model_accuracy``: runs the comparison (run.py)."""

import sys

from benchmarks.cost_model_accuracy.run import main

sys.argv[0] = "python -m benchmarks.cost_model_accuracy"  # argparse's usage line names the command to type
raise SystemExit(main())
