"""`gyre proxy CONFIG` and `gyre engine CONFIG` read a run config as `gyre run` does: its
section, the shared top-level values, then the flags typed, then `--set section.field=value`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gyre.cli import app
from gyre.config import load_section
from gyre.engine.cli import engine_config
from gyre.engine.config import EmbeddedEngineConfig, VllmEngineConfig
from gyre.proxy.cli import CLI_PORT, _config

RUN = """
model_dir = "{model}"
seed = 7

[policy]
batch_groups = 2

[engine]
max_batch = 5
kind = "embedded"

[engine.vllm]
kv_cache_gb = 3

[proxy]
mode = "managed"
default_max_tokens = 33
"""


@pytest.fixture
def run_toml(tmp_path: Path) -> Path:
    (tmp_path / "m").mkdir()
    p = tmp_path / "run.toml"
    p.write_text(RUN.format(model=tmp_path / "m"))
    return p


def test_proxy_reads_its_section_then_flags_then_set(run_toml: Path) -> None:
    dead = "http://127.0.0.1:1"
    cfg = _config(run_toml, ["proxy.engine_wait_s=5"], {"engines": [dead], "mode": None})
    assert cfg.model_dir == str(run_toml.parent / "m")  # the run's top-level model_dir
    assert (cfg.mode, cfg.default_max_tokens, cfg.engine_wait_s) == ("managed", 33, 5.0)
    assert cfg.port == CLI_PORT and cfg.engines == [dead]
    # a flag typed wins over the file; --set wins over the flag
    cfg = _config(run_toml, ["proxy.mode=managed"], {"engines": [dead], "mode": "open"})
    assert cfg.mode == "managed"
    assert _config(run_toml, [], {"engines": [dead], "mode": "open"}).mode == "open"


def test_engine_section_keeps_the_runs_seed_and_vllm_table(run_toml: Path) -> None:
    data = load_section(run_toml, "engine", ["engine.prefill_chunk_tokens=64"], {"max_batch": None})
    data.pop("kind")
    ec = engine_config("embedded", data)
    assert isinstance(ec, EmbeddedEngineConfig)
    assert (ec.max_batch, ec.seed, ec.prefill_chunk_tokens) == (5, 7, 64)
    assert ec.logprob_mode == EmbeddedEngineConfig.model_fields["logprob_mode"].default
    vc = engine_config("vllm", data, vllm_url="http://127.0.0.1:2")
    assert isinstance(vc, VllmEngineConfig) and vc.kv_cache_gb == 3


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["proxy", "{cfg}", "--set", "policy.cells=3"], ("only proxy.field=value",)),
        (["proxy", "{cfg}"], ("--engine URL",)),
        (["proxy", "{cfg}", "--engine", "http://127.0.0.1:1", "--set", "proxy.mode=x"], ("mode",)),
        (["engine", "{cfg}", "--set", "engine.port=70000"], ("port",)),
        (["engine", "{missing}"], ("does not exist",)),
    ],
    ids=["set-outside-section", "no-engine", "bad-mode", "bad-port", "no-file"],
)
def test_config_mistakes_are_one_line(run_toml: Path, argv: list[str], words) -> None:
    args = [a.format(cfg=run_toml, missing=run_toml.parent / "nope.toml") for a in argv]
    r = CliRunner().invoke(app, args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in lines[0], lines[0]


def test_help_texts_read_the_models_defaults() -> None:
    r = CliRunner().invoke(app, ["engine", "--help"], env={"COLUMNS": "300"})
    default = EmbeddedEngineConfig.model_fields["prefill_chunk_tokens"].default
    assert f"default {default};" in re.sub(r"[\s│]+", " ", r.output)  # undo the wrapping
