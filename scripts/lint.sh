#!/usr/bin/env bash
# Static checks, in the project's .venv (scripts/setup.sh makes it): ruff lint, ruff format
# (check only, nothing is rewritten) and mypy (configured in pyproject.toml). CI runs this
# before the tests; a failure names the file and line.
#   bash scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GYRE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "lint: no virtual environment at $VENV; run: bash scripts/setup.sh" >&2
  exit 2
fi
. "$VENV/bin/activate"
paths=(gyre tests bench scripts)
echo "[lint] ruff check"
ruff check "${paths[@]}"
echo "[lint] ruff format --check"
ruff format --check "${paths[@]}"
echo "[lint] mypy"
mypy
