#!/usr/bin/env bash
# Install the real, unmodified harness programs that the end-to-end tests drive:
# mini-swe-agent (PyPI) into the active venv; Claude Code, Qwen Code and Codex CLI
# (npm, pinned) each under .cache/harnesses/<name>. Idempotent: a harness whose pinned
# version is already there is skipped without touching npm. Tests that need one skip
# with a reason when it is absent.
set -uo pipefail
cd "$(dirname "$0")/.."
MSWEA_VERSION=${MSWEA_VERSION:-2.4.6}
CLAUDE_CODE_VERSION=${CLAUDE_CODE_VERSION:-2.1.332}
QWEN_CODE_VERSION=${QWEN_CODE_VERSION:-0.24.4}
CODEX_VERSION=${CODEX_VERSION:-0.171.0}
if ! python -c "import minisweagent" 2>/dev/null; then
  echo "[setup] installing mini-swe-agent==$MSWEA_VERSION"
  python -m pip install -q "mini-swe-agent==$MSWEA_VERSION" || echo "[setup] WARNING: mini-swe-agent install failed"
fi
# npm_harness FOLDER PACKAGE VERSION BIN: install PACKAGE@VERSION under .cache/harnesses/FOLDER
# unless BIN is there at that version already (read from the package.json, no npm call).
npm_harness() {
  local dest=.cache/harnesses/$1 pkg=$2 ver=$3 bin=$4 have=""
  have=$(sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "$dest/node_modules/$pkg/package.json" 2>/dev/null | head -n 1)
  if [ -x "$dest/node_modules/.bin/$bin" ] && [ "$have" = "$ver" ]; then
    return 0
  fi
  command -v npm >/dev/null || { echo "[setup] WARNING: npm not found; $pkg not installed"; return 0; }
  echo "[setup] installing $pkg@$ver"
  mkdir -p "$dest"
  (cd "$dest" && npm install --silent --no-audit --no-fund "$pkg@$ver" >/dev/null) \
    || echo "[setup] WARNING: $pkg install failed"
}
npm_harness claude-code @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
npm_harness qwen-code @qwen-code/qwen-code "$QWEN_CODE_VERSION" qwen
npm_harness codex @openai/codex "$CODEX_VERSION" codex
exit 0
