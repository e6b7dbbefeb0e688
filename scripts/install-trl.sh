#!/usr/bin/env bash
# Install TRL (pinned) into its own venv, the peer bench/vs_trl/bench_vs_trl.py runs beside Gyre.
# TRL is never a Gyre dependency: its pins stay out of Gyre's venv. The venv gets the same
# torch and transformers versions as Gyre's (.venv), so the two sides run the same kernels
# and the same model code; torch goes first, from the CPU wheel on disk (an unpinned torch
# pulls a multi-GB CUDA build). Idempotent: a venv that already imports the pinned TRL is left
# alone. ~2 min the first time.
#
# Usage: scripts/install-trl.sh [VENV_DIR]   (default .venv-trl; env TRL_VERSION, TORCH_VERSION,
#        TRANSFORMERS_VERSION; the last defaults to the version in .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-trl}
VERSION=${TRL_VERSION:-1.16.0}
TORCH=${TORCH_VERSION:-2.13.0}
PY=${PYTHON:-python3}
if [ -z "${TRANSFORMERS_VERSION:-}" ] && [ -x .venv/bin/python ]; then
  TRANSFORMERS_VERSION=$(.venv/bin/python -c 'from importlib.metadata import version; print(version("transformers"))')
fi
TF=${TRANSFORMERS_VERSION:-5.24.0}

have() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VERSION" "$TF" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if (version("trl"), version("transformers")) == (sys.argv[1], sys.argv[2]) else 1)
PY
}

if have; then
  echo "[trl] trl==$VERSION with transformers==$TF already in $VENV; nothing to do"
else
  if [ ! -x "$VENV/bin/python" ]; then
    echo "[trl] creating venv $VENV with $($PY --version)"
    "$PY" -m venv "$VENV"
  fi
  echo "[trl] installing torch==$TORCH (CPU), then trl==$VERSION transformers==$TF into $VENV"
  t0=$(date +%s)
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # `torch==X` matches the local build X+cpu, which sorts above a plain X: pip takes the CPU wheel
  "$VENV/bin/python" -m pip install -q "torch==$TORCH"
  "$VENV/bin/python" -m pip install -q "torch==$TORCH" "trl==$VERSION" "transformers==$TF" \
    datasets accelerate psutil
  echo "[trl] pip install took $(( $(date +%s) - t0 )) s"
fi

"$VENV/bin/python" - <<'PY'
from importlib.metadata import version
import torch, trl  # noqa: F401  (the import is the check)
from trl import GRPOConfig, GRPOTrainer  # noqa: F401
print(f"[trl] ok: trl {version('trl')}, torch {torch.__version__}, "
      f"transformers {version('transformers')}, cuda build: {torch.version.cuda}")
PY
echo "[trl] size: $(du -sh "$VENV" | cut -f1); python: $VENV/bin/python"
echo "[trl] run the comparison: python bench/vs_trl/bench_vs_trl.py --steps 2 --held-out 8"
