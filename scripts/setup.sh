#!/usr/bin/env bash
# Create .venv (if missing) and install Gyre with everything its tests need.
# Idempotent: a second run only checks. Installs the pinned CPU torch wheel
# first, because an unpinned torch pulls a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GYRE_VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
stamp="$VENV/.gyre-installed"
want="$(cat pyproject.toml scripts/setup.sh | sha1sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing (torch CPU wheel first, then gyre[dev])"
  python -m pip install -q --upgrade pip
  python -m pip install -q torch==2.13.0
  python -m pip install -q -e ".[dev]"
  echo "$want" > "$stamp"
fi
# Third-party harness programs for the end-to-end tests (optional for users).
if [ "${GYRE_SKIP_HARNESSES:-0}" != "1" ]; then
  bash scripts/install-harnesses.sh
fi
# bubblewrap: the harness sandbox, on by default (gyre.harness.sandbox); installed whether or
# not the third-party harnesses are, since every sandboxed test and `gyre run` need it. Without
# it an executor refuses to start unless told `executor.sandbox = false`.
if ! command -v bwrap >/dev/null && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "[setup] installing bubblewrap (harness sandbox)"
  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1)) \
    || echo "[setup] WARNING: bubblewrap install failed (the harness sandbox will be unavailable)"
fi
# Chromium: tests/integration/test_runs_browser.py renders `gyre runs show`'s page headless
# (skipped without it). ~270 MB with its libraries; GYRE_SKIP_CHROMIUM=1 leaves it out.
if [ "${GYRE_SKIP_CHROMIUM:-0}" != "1" ] && ! command -v chromium >/dev/null && [ "$(id -u)" = "0" ] \
  && command -v apt-get >/dev/null; then
  echo "[setup] installing chromium (run report browser test)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1 \
    || echo "[setup] WARNING: chromium install failed (the browser test will be skipped)"
fi
# The escape suite's unprivileged launcher (tests/integration/test_sandbox_escapes.py) runs
# Gyre as another user with setpriv (util-linux) and the system Python.
if ! command -v setpriv >/dev/null && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  apt-get install -y -qq util-linux >/dev/null 2>&1 || echo "[setup] WARNING: setpriv unavailable"
fi
