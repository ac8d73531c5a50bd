#!/usr/bin/env bash
# Set up (if needed) and run the demo: a server, a trainer and a worker on localhost learning Pendulum-v1.
# Ctrl+C stops all three. Extra arguments go to `python -m netrl --demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m netrl --demo "$@"
