#!/usr/bin/env bash
# Install egraph-mirage on a fresh machine; no GPU needed.
#   bash scripts/setup.sh          the package and its dependencies
#   bash scripts/setup.sh --dev    also the test tools, and graphviz's `dot` for SVG rendering
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
dev=0
[ "${1:-}" = "--dev" ] && dev=1

# torch: keep an installed build (a CUDA one on a GPU machine); otherwise take the CPU build,
# before anything else asks for torch and pulls the multi-GB CUDA packages.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install -q "torch==2.13.0"
fi

if [ "$dev" = 1 ]; then
    "$PY" -m pip install -q -e ".[dev]"
    # graphviz's `dot` (SVG rendering), and a C++ compiler (torch.compile's CPU backend, which
    # the test of the compiled baselines runs)
    missing=""
    command -v dot >/dev/null 2>&1 || missing=" graphviz"
    command -v g++ >/dev/null 2>&1 || command -v c++ >/dev/null 2>&1 || missing="$missing g++"
    if [ -n "$missing" ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
            apt-get update -qq && apt-get install -y -qq $missing >/dev/null
        else
            echo "setup: missing system packages:$missing (e.g. apt-get install$missing)" >&2
            exit 1
        fi
    fi
    # a python3 Jupyter kernel for the notebook tests
    "$PY" -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
else
    "$PY" -m pip install -q -e .
fi
