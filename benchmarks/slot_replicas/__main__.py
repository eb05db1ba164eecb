import sys

from benchmarks.slot_replicas.run import main

sys.exit(main())
