"""`gyre model tiny --head-dim`: a per-head size apart from hidden/4 (vLLM's CPU attention takes
32, 64, 80, ...; 16 crashes it), with the default sizes unchanged."""

import json

from gyre.models.tiny import build_tiny_model, tiny_config_kwargs


def test_head_dim_default_and_override(tmp_path):
    assert tiny_config_kwargs(100, hidden=64)["head_dim"] == 16
    assert tiny_config_kwargs(100, hidden=64, head_dim=32)["head_dim"] == 32
    out = build_tiny_model(tmp_path / "m", hidden=64, head_dim=32, vocab_size=300)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["head_dim"] == 32 and cfg["hidden_size"] == 64
    assert json.loads((out / "gyre_tiny.json").read_text())["head_dim"] == 32
