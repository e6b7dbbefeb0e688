#!/usr/bin/env bash
# The main job on a fresh machine: set up, then run the scheduling simulator on the
# seed's toy workload for all three placements.
set -euo pipefail
cd "$(dirname "$0")/.."
GYRE_SKIP_HARNESSES=1 bash scripts/setup.sh
. "${GYRE_VENV:-.venv}/bin/activate"
exec gyre sim --preset seed-toy --placement all "$@"
