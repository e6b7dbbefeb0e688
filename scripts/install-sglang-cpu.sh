#!/usr/bin/env bash
# Install SGLang (PyPI `sglang`, pinned) into its own Python 3.11 venv so that a real SGLang
# server can run on this CPU host behind Gyre's client, proxy and weight sync. The `sglang`
# integration tests and gyre.engine.sglang_launch use it (tests/integration/test_engine_sglang.py,
# docs/engine.md "Real SGLang on CPU").
#
# Why it is not `pip install sglang`: the wheel (cp311 only) requires ~30 CUDA packages
# (flashinfer, deep-gemm, cutlass-dsl, nvshmem, ...) that cannot work here, so it is installed
# with --no-deps and the dependencies its server imports are listed below. torch is PyPI's
# 2.14.1 (a CUDA build, which runs on CPU; sglang pins it, and torchvision must match it).
# PyPI's sglang-kernel is CUDA-only (its common_ops needs libcuda.so.1) and SGLang's CPU
# kernels (`sgl-kernel/csrc/cpu`) are published nowhere on PyPI, yet sglang imports
# `sgl_kernel` unconditionally: a stand-in package whose functions raise is written instead.
# SGLang then runs its torch-native paths (--attention-backend torch_native).
# Idempotent. ~7 min and ~7 GB the first time.
#
# Usage: scripts/install-sglang-cpu.sh [VENV_DIR]   (default .venv-sglang; env SGLANG_VERSION)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-sglang}
VERSION=${SGLANG_VERSION:-0.5.23}
PY=${PYTHON:-python3.11}

DEPS=(
  "torch==2.14.1" "torchvision==0.29.1" numpy aiohttp fastapi "uvicorn>=0.51" uvloop orjson
  "pyzmq>=25.1.2" psutil setproctitle "transformers==5.19.0" "tokenizers==0.23.2" pydantic
  requests pybase64 msgspec "prometheus-client>=0.20.0" python-multipart interegular
  partial_json_parser "sentencepiece==0.2.1" tiktoken einops packaging pillow safetensors
  "openai==2.8.0" "openai-harmony==0.0.4" "blobfile==3.0.0" gguf xxhash zstandard watchfiles
  scipy "python-dateutil<3" tqdm regex distro easydict "anthropic>=0.20.0" "xgrammar==0.2.7"
  "llguidance>=1.7.6,<2" "compressed-tensors==0.18.0" IPython datasets "mistral_common>=1.11.5"
  "soundfile==0.13.1" "timm==1.0.25" "numba==0.65.1" "torch_memory_saver>=0.0.9.post1" ninja
  build nvidia-ml-py "smg-grpc-servicer>=0.9.0" py-spy "kernels>=0.14.1,<0.15"
  "outlines==0.1.11" modelscope
)

have() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("sglang") == sys.argv[1] else 1)
PY
}

if ! command -v "$PY" >/dev/null; then
  echo "[sglang] $PY not found: the sglang wheel is cp311 only (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
if have; then
  echo "[sglang] sglang==$VERSION already in $VENV; checking its parts"
else
  [ -x "$VENV/bin/python" ] || { echo "[sglang] creating venv $VENV with $($PY --version)"; "$PY" -m venv "$VENV"; }
  echo "[sglang] installing sglang==$VERSION and its CPU-usable dependencies (~7 min, ~7 GB)"
  t0=$(date +%s)
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "${DEPS[@]}"
  "$VENV/bin/python" -m pip install -q --no-deps "sglang==$VERSION"
  echo "[sglang] pip install took $(( $(date +%s) - t0 )) s"
fi

# The CUDA-only kernel wheels, if anything pulled them in, would shadow the stand-in.
"$VENV/bin/python" -m pip uninstall -q -y sglang-kernel sgl-kernel 2>/dev/null || true
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$SITE/sgl_kernel"
cat > "$SITE/sgl_kernel/__init__.py" <<'PY'
"""Stand-in for sgl_kernel written by Gyre's scripts/install-sglang-cpu.sh.

PyPI's sglang-kernel is CUDA-only and SGLang's CPU kernels are not on PyPI, but sglang imports
names from sgl_kernel unconditionally. Every name resolves; calling one raises, so a code path
that really needs a kernel fails loudly instead of computing something else."""

__version__ = "0.0.0+gyre-stand-in"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name}: no CPU build of sgl-kernel in this venv")

    missing.__name__ = name
    return missing
PY

SGLANG_USE_CPU_ENGINE=1 "$VENV/bin/python" - <<'PY' 2>&1 | grep -v -i warn
from importlib.metadata import version
import torch
import sglang.srt.entrypoints.http_server  # noqa: F401  (the import is the check)
print(f"[sglang] ok: sglang {version('sglang')}, torch {torch.__version__}, "
      f"transformers {version('transformers')}")
PY
echo "[sglang] size: $(du -sh "$VENV" | cut -f1); python: $VENV/bin/python"
echo "[sglang] run the tests: python -m pytest -m sglang tests/integration/test_engine_sglang.py"
