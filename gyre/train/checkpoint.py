"""Core checkpoints: HF-layout safetensors weights, optimizer state, policy version, data cursor.

Layout of one checkpoint ``<root>/step-<n>/``::

    config.json, model.safetensors, generation_config.json  # AutoModelForCausalLM.from_pretrained(dir)
    tokenizer files copied from the source model dir (if any)
    optimizer.pt                                             # torch.save(optimizer.state_dict())
    trainer_state.json                                       # step, policy_version, consumed groups

A checkpoint is written to a temporary directory and renamed into place, and
``<root>/latest`` names the newest complete one, so a crash while saving leaves
the previous checkpoint intact. The cursor is saved with the weights it
produced: groups of a step that did not finish are not in it and are trained
after resume; groups of a finished step are, and are never trained again.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


@dataclass
class TrainerState:
    step: int = 0  # batches committed
    policy_version: int = 0  # optimizer steps applied to the initial weights
    consumed_groups: list[str] = field(default_factory=list)
    model_source: str = ""


def write_hf(model: torch.nn.Module, model_source: str | Path | None, out: Path) -> None:
    """Weights in Hugging Face layout plus the source directory's tokenizer files (what
    ``from_pretrained`` and an engine's reload-from-disk read)."""
    hf: Any = model  # a Hugging Face PreTrainedModel; save_pretrained is not on nn.Module
    hf.save_pretrained(out, safe_serialization=True)
    src = Path(model_source) if model_source else None
    if src is not None and src.is_dir():
        for name in TOKENIZER_FILES:
            if (src / name).exists():
                shutil.copy2(src / name, out / name)


def save_checkpoint(
    root: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    state: TrainerState,
    *,
    keep: int,
    extra: dict[str, Path] | None = None,
) -> Path:
    """Write ``state.step``'s checkpoint and prune to the newest ``keep`` (the caller passes
    ``trainer.checkpoint.keep``, whose default is the one retention default). ``extra``: files
    written by others (a sharded core's other ranks) moved in under these names before the
    checkpoint becomes ``latest``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{state.step}"
    tmp = root / f".tmp-step-{state.step}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    write_hf(model, state.model_source, tmp)
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(state)))
    for name, path in (extra or {}).items():
        os.replace(path, tmp / name)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    latest_tmp = root / f".latest.{os.getpid()}"
    latest_tmp.write_text(final.name)
    os.replace(latest_tmp, root / "latest")
    steps = sorted(
        (p for p in root.glob("step-*") if p.is_dir()), key=lambda p: int(p.name.split("-")[1])
    )
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: str | Path | None) -> Path | None:
    if root is None:
        return None
    f = Path(root) / "latest"
    if not f.exists():
        return None
    p = Path(root) / f.read_text().strip()
    return p if (p / "trainer_state.json").exists() else None


def load_state(ckpt: Path) -> TrainerState:
    return TrainerState(**json.loads((ckpt / "trainer_state.json").read_text()))


def load_optimizer(ckpt: Path, optimizer: torch.optim.Optimizer) -> None:
    optimizer.load_state_dict(torch.load(ckpt / "optimizer.pt", weights_only=True))
