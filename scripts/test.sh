#!/usr/bin/env bash
# The test command: set up (idempotent) and run the CPU suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${GYRE_VENV:-.venv}/bin/activate"
exec python -m pytest -q -m "not gpu" "$@"
