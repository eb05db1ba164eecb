"""Allow ``python -m kungfu_tf.run ...``."""

import sys

from kungfu_tf.run.launch.launcher import main

if __name__ == "__main__":
    sys.exit(main())
