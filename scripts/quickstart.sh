#!/usr/bin/env bash
# The main job on a fresh machine: set up, build the tiny model offline, then train it with
# `gyre run examples/quickstart.toml` (3 elastic cells on a local Ray, the reference agent's
# calls through the proxy, the quickstart task set). Extra arguments go to `gyre run`
# (e.g. --set policy.placement=colocate, --set seed=1, --quiet).
set -euo pipefail
cd "$(dirname "$0")/.."
GYRE_SKIP_HARNESSES=1 bash scripts/setup.sh
. "${GYRE_VENV:-.venv}/bin/activate"
gyre model tiny runs/tiny-model >/dev/null
exec gyre run examples/quickstart.toml "$@"
