#!/usr/bin/env bash
# Install the real, unmodified harness programs that the end-to-end tests drive:
# mini-swe-agent (PyPI) into the active venv, Claude Code (npm, pinned) under
# .cache/harnesses. Tests that need one skip with a reason when it is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
MSWEA_VERSION=${MSWEA_VERSION:-2.4.6}
CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.332}
if ! python -c "import minisweagent" 2>/dev/null; then
  echo "[setup] installing mini-swe-agent==$MSWEA_VERSION"
  python -m pip install -q "mini-swe-agent==$MSWEA_VERSION" || echo "[setup] WARNING: mini-swe-agent install failed"
fi
dest=.cache/harnesses/claude-code
if [ ! -x "$dest/node_modules/.bin/claude" ] && command -v npm >/dev/null; then
  echo "[setup] installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION"
  mkdir -p "$dest"
  (cd "$dest" && npm install --silent --no-audit --no-fund "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >/dev/null) \
    || echo "[setup] WARNING: Claude Code install failed"
fi
# bubblewrap: the optional harness sandbox (gyre.harness.sandbox). Non-fatal: the
# executor runs without it and the sandbox tests skip with a reason.
if ! command -v bwrap >/dev/null && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  echo "[setup] installing bubblewrap (harness sandbox)"
  (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1)) \
    || echo "[setup] WARNING: bubblewrap install failed (the harness sandbox will be unavailable)"
fi
exit 0
