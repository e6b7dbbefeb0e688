"""One typed configuration for a whole Gyre run.

Each package owns its section's model (policy, engine, proxy, trainer,
executor); this module only composes them, so a controller or a Ray actor gets
exactly the object its package defines and nothing is configured twice. The
model directory is given once at the top and copied into every section that
needs it, unless a section names its own (a different tokenizer for the proxy,
say).

Files are TOML. ``--set section.field=value`` overrides take JSON values where
they parse as JSON (numbers, booleans, lists) and plain strings otherwise.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gyre.harness.config import ExecutorConfig
from gyre.policy.config import Placement, PolicyConfig
from gyre.proxy.config import ProxyConfig
from gyre.proxy.sampling import DEFAULTS as SAMPLING_DEFAULTS
from gyre.proxy.sampling import departures
from gyre.runtime.config import RunConfig
from gyre.runtime.engines import RolloutEngineConfig
from gyre.train.config import TrainerConfig

_SECTIONS_WITH_MODEL = ("engine", "proxy", "trainer")
_SECTIONS_WITH_SEED = ("engine", "trainer")  # one seed: engines sample, the trainer inits


class GyreConfig(BaseModel):
    """The run: one model, one policy, and each component's own section."""

    model_config = ConfigDict(extra="forbid")

    model_dir: str = Field(description="HF model directory (weights, tokenizer, chat template)")
    work_dir: str = Field(
        "runs/gyre", description="traces, workspaces, checkpoints and logs go below this"
    )
    seed: int = 0
    policy: PolicyConfig  # placement defaults to elastic (_share_model_dir fills it in)
    engine: RolloutEngineConfig  # the embedded engine's settings, or kind = "vllm"
    proxy: ProxyConfig
    trainer: TrainerConfig
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    run: RunConfig = Field(default_factory=RunConfig)

    @model_validator(mode="before")
    @classmethod
    def _share_model_dir(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in _SECTIONS_WITH_MODEL if "model_dir" in data else ():
            section = dict(data.get(name) or {})
            section.setdefault("model_dir", data["model_dir"])
            data[name] = section
        if "seed" in data:
            for name in _SECTIONS_WITH_SEED:
                section = dict(data.get(name) or {})
                section.setdefault("seed", data["seed"])
                data[name] = section
        policy = data.get("policy", {})  # the run's placement default, written once
        if isinstance(policy, dict) and "placement" not in policy:
            data["policy"] = {**policy, "placement": Placement.ELASTIC}
        return data

    @model_validator(mode="before")
    @classmethod
    def _fix_sampling(cls, data: Any) -> Any:
        """A training run's sampling distribution is its config's: every ``[proxy.sampling]``
        field left unset is the engine default, which the proxy then sends on every request
        instead of a harness's own (gyre.proxy.sampling)."""
        if not isinstance(data, dict) or not isinstance(data.get("proxy", {}), dict):
            return data
        proxy = dict(data.get("proxy") or {})
        sampling = proxy.get("sampling") or {}
        if isinstance(sampling, dict):
            proxy["sampling"] = {**SAMPLING_DEFAULTS, **sampling}
        return {**data, "proxy": proxy}

    @model_validator(mode="after")
    def _behaviour_logprob_named(self) -> GyreConfig:
        """Refuse a run whose recorded behaviour log-prob would silently not be the probability
        its tokens were drawn with: a tempered or truncated distribution needs the user to name
        the log-prob the engine records (and the trainer uses as the behaviour policy)."""
        off = departures(self.proxy.sampling.model_dump())
        mode = self.engine.logprob_mode
        cut = [d for d in off if not d.startswith("temperature=")]  # tempered is exact without
        if off and (
            "logprob_mode" not in self.engine.model_fields_set or (mode == "tempered" and cut)
        ):
            raise ValueError(
                f"proxy.sampling {', '.join(off)} is not the model's own distribution, so the "
                "raw log-probs the trainer recomputes are not the behaviour's: set "
                "engine.logprob_mode = 'processed' (exact) or 'raw' (biased); docs/engine.md"
            )
        return self

    @model_validator(mode="after")
    def _one_batch_size(self) -> GyreConfig:
        """B is declared once, in the policy (its default included); the trainer's stream
        section follows it, and a stream B the user wrote that differs is refused."""
        B, stream = self.policy.batch_groups, self.trainer.stream
        if stream.batch_groups != B:
            if "batch_groups" in stream.model_fields_set:
                raise ValueError(
                    f"trainer.stream.batch_groups ({stream.batch_groups}) differs from "
                    f"policy.batch_groups ({B}); set B once, in [policy]"
                )
            self.trainer = self.trainer.model_copy(
                update={"stream": stream.model_copy(update={"batch_groups": B})}
            )
        return self


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` overrides to a nested dict (copying what it touches)."""
    out = json.loads(json.dumps(data))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"override {item!r} is not of the form section.field=value")
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"override {item!r}: {p!r} is a value, not a section")
            node = nxt
        node[parts[-1]] = _parse_value(value)
    return out


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, **top: Any
) -> GyreConfig:
    """Read a TOML (or a run directory's JSON) file (optional), apply overrides, validate.

    Keyword arguments set top-level fields (``model_dir=...``) before overrides.
    A validation error names the offending field path.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist")
        if p.suffix == ".json":  # a run directory's exact copy (gyre run --resume)
            data = json.loads(p.read_text())
        else:
            with open(p, "rb") as f:
                data = tomllib.load(f)
    data.update({k: v for k, v in top.items() if v is not None})
    data = apply_overrides(data, overrides or [])
    return GyreConfig.model_validate(data)


def load_section(
    path: str | Path | None,
    section: str,
    overrides: list[str] | None = None,
    given: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One component's section of a run config, for ``gyre proxy CONFIG`` and
    ``gyre engine CONFIG``: the same file and the same ``--set section.field=value`` as
    ``gyre run``, so a run's ``[proxy]`` or ``[engine]`` serves standalone unchanged.

    The file's top-level ``model_dir`` and ``seed`` reach the section as in a run (the
    section's own win); ``given`` (the command's flags the user typed) come next and the
    overrides last. Returns plain data: the caller validates it with its own model, so each
    default stays the model's. Raises FileNotFoundError / ValueError (TOML syntax, overrides).
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"config file {p} does not exist")
        with open(p, "rb") as f:
            data = tomllib.load(f)
    body = data.get(section) or {}
    if not isinstance(body, dict):
        raise ValueError(f"[{section}] in {path} is a value, not a section")
    shared = {
        k: data[k]
        for k, sections in (("model_dir", _SECTIONS_WITH_MODEL), ("seed", _SECTIONS_WITH_SEED))
        if k in data and section in sections
    }
    merged = {**shared, **body, **{k: v for k, v in (given or {}).items() if v is not None}}
    for item in overrides or []:
        if not item.strip().startswith(f"{section}."):
            raise ValueError(f"override {item!r}: only {section}.field=value applies here")
    return apply_overrides({section: merged}, overrides or [])[section]
