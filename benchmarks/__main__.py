"""``python -m benchmarks <family> [options]``: see benchmarks/run.py."""

import sys

from benchmarks.run import main

if __name__ == "__main__":  # (a process spawned by multiprocessing imports this module too)
    sys.exit(main())
