"""Start and stop a real SGLang server on CPU from its own venv (``scripts/install-sglang-cpu.sh``).

SGLang speaks Gyre's wire protocol natively, so no adapter sits in between: the proxy, the
:class:`~gyre.engine.client.EngineClient` and :mod:`gyre.train.weight_sync` talk to it
directly. Like vLLM it lives in a separate venv (its torch and transformers pins would fight
Gyre's) and runs as a subprocess of that venv's Python, never imported here.

The command line is what was seen to work on a CPU host without SGLang's CPU kernels (PyPI
ships sgl-kernel for CUDA only; the install script puts a stand-in ``sgl_kernel`` in the
venv whose functions raise): ``SGLANG_USE_CPU_ENGINE=1`` and ``--device cpu`` select the CPU
platform; ``--attention-backend torch_native`` because the x86 default, ``intel_amx``, is
one of those kernels; ``--grammar-backend none`` (no constrained decoding here);
``--skip-tokenizer-init`` (ids in, ids out: the proxy tokenizes); ``--dtype float32``.
``SGLANG_RETURN_ORIGINAL_LOGPROB=1`` makes its log-probs the raw log-softmax, Gyre's
default ``logprob_mode`` (docs/engine.md).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from gyre.engine.vllm_launch import REPO, VllmServer

DEFAULT_VENV = REPO / ".venv-sglang"
MAX_TOTAL_TOKENS = 8192
"""K/V slots SGLang allocates (tokens over all live requests): enough for the tests, and
small, so that its memory-fraction heuristic never sizes the pool from the host's RAM."""


def sglang_python() -> str | None:
    """The SGLang venv's Python: ``GYRE_SGLANG_PYTHON`` if set, else ``.venv-sglang/bin/python``
    in the repository; None when neither exists (the caller skips or says how to install)."""
    env = os.environ.get("GYRE_SGLANG_PYTHON")
    if env:
        return env if Path(env).exists() else None
    py = DEFAULT_VENV / "bin" / "python"
    return str(py) if py.exists() else None


def sglang_command(
    python: str, model_dir: str, host: str, port: int, extra_args: tuple[str, ...] = ()
) -> list[str]:
    return [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_dir),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--dtype",
        "float32",
        "--grammar-backend",
        "none",
        "--skip-tokenizer-init",
        "--skip-server-warmup",
        "--max-total-tokens",
        str(MAX_TOTAL_TOKENS),
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        "warning",
        *extra_args,
    ]


def sglang_env(logprob_mode: str = "raw", base: dict[str, str] | None = None) -> dict[str, str]:
    if logprob_mode not in ("raw", "tempered"):
        raise ValueError(f"logprob_mode {logprob_mode!r} has no SGLang equivalent: raw or tempered")
    env = dict(os.environ if base is None else base)
    env.pop("PYTHONPATH", None)  # Gyre's paths must not shadow the SGLang venv's packages
    env.pop("GYRE_ENGINE_API_KEY", None)  # the run's engine key stays in Gyre's own processes
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["SGLANG_RETURN_ORIGINAL_LOGPROB"] = "1" if logprob_mode == "raw" else "0"
    return env


class SglangServer(VllmServer):
    """One SGLang CPU server process (its scheduler and detokenizer are in its process group)."""

    label = "SGLang"
    missing_hint = "no SGLang venv: run scripts/install-sglang-cpu.sh or set GYRE_SGLANG_PYTHON"

    @staticmethod
    def default_python() -> str | None:
        return sglang_python()

    def command(self) -> list[str]:
        assert self.python is not None
        return sglang_command(self.python, self.model_dir, self.host, self.port, self.extra_args)

    def env(self) -> dict[str, str]:
        return sglang_env(self.logprob_mode)


def installed() -> bool:
    """Whether an SGLang venv is there to launch (what the ``sglang`` tests skip on)."""
    py = sglang_python()
    return py is not None and shutil.which(py) is not None
