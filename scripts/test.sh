#!/usr/bin/env bash
# Set up (if needed) and run the checks CI runs: ruff, mypy and the default test suite (about 5 minutes on 2 cores).
# Extra arguments go to pytest, e.g. scripts/test.sh -m slow for the long learning runs.
set -euo pipefail
cd "$(dirname "$0")/.."
NETRL_EXTRAS=dev,torchrl ./scripts/setup.sh
.venv/bin/ruff check netrl tests scripts benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
