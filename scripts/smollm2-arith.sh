#!/usr/bin/env bash
# Train the real model: SmolLM2-135M-Instruct learns 2-digit arithmetic (examples/smollm2-arith.toml).
#   bash scripts/smollm2-arith.sh              # prepare (once), then gyre run the example
#   bash scripts/smollm2-arith.sh --prepare    # only: set up .venv, import the model, write the tasks
#   bash scripts/smollm2-arith.sh --set policy.total_steps=6 ...   # extra args go to gyre run
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/get-smollm2.sh
. "${GYRE_VENV:-.venv}/bin/activate"
if [ ! -d runs/tasks/arith ]; then
  gyre harness generate arith runs/tasks/arith --seed 0 --train 256 --held-out 64
fi
if [ "${1:-}" = "--prepare" ]; then
  exit 0
fi
exec gyre run examples/smollm2-arith.toml "$@"
