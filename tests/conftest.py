"""Shared fixtures. The tiny model is built once per test session, offline."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Property tests draw the same examples on every run (a red CI is a regression, not a lucky
# draw); GYRE_HYPOTHESIS_RANDOM=1 (with GYRE_HYPOTHESIS_SCALE=10) searches afresh.
settings.register_profile("gyre", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("explore" if os.environ.get("GYRE_HYPOTHESIS_RANDOM") == "1" else "gyre")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny Qwen3 model + tokenizer directory (HF layout), built from a config."""
    from gyre.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
