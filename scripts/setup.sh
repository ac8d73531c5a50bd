#!/usr/bin/env bash
# Create .venv/ and install netrl with its test tools.
#
# torch comes first, pinned to 2.13.0: on a machine without CUDA it must be a CPU build, because an unpinned
# "torch" (or any package that asks for it) would pull several GB of CUDA wheels. pip takes a local CPU wheel
# when one is on its find-links; otherwise the CPU build comes from PyTorch's own index. With torch installed,
# netrl's "torch>=2.2" is already satisfied and nothing else is downloaded for it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
TORCH=${NETRL_TORCH:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip --disable-pip-version-check)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "setup: CUDA found; installing $TORCH with CUDA support"
    "${PIP[@]}" install --quiet "$TORCH"
  else
    report=$(mktemp)
    "${PIP[@]}" install --quiet --dry-run --ignore-installed --report "$report" "$TORCH" 2>/dev/null || true
    if .venv/bin/python - "$report" <<'PY'
import json, sys
try:
    report = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(1)
torch = [i for i in report.get("install", []) if i["metadata"]["name"] == "torch"]
sys.exit(0 if torch and "+cpu" in torch[0]["metadata"]["version"] else 1)
PY
    then
      echo "setup: no CUDA; installing the CPU build of $TORCH"
      "${PIP[@]}" install --quiet "$TORCH"
    else
      echo "setup: no CUDA; installing $TORCH from PyTorch's CPU index"
      "${PIP[@]}" install --quiet "$TORCH" --index-url https://download.pytorch.org/whl/cpu \
        --extra-index-url https://pypi.org/simple
    fi
    rm -f "$report"
  fi
fi
# NETRL_EXTRAS: the optional extras to install too (scripts/test.sh adds torchrl, whose tests run in CI)
"${PIP[@]}" install --quiet -e ".[${NETRL_EXTRAS:-dev}]"
.venv/bin/python -c "import torch, netrl; print(f'setup: netrl {netrl.__version__} with torch {torch.__version__} in .venv/')"
