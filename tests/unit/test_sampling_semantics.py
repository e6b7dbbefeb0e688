"""Sampling semantics (docs/engine.md): which distribution the engine samples from, which
log-prob it records, and what a run refuses. The end-to-end halves are in
tests/integration/test_proxy_sampling.py and test_engine_embedded.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gyre.config import GyreConfig, load_config
from gyre.engine.cli import engine_config
from gyre.engine.config import VllmEngineConfig
from gyre.engine.vllm_launch import VllmServer, vllm_command
from gyre.proxy.config import SamplingConfig
from gyre.proxy.sampling import (
    DEFAULTS,
    SamplingRefused,
    departures,
    effective,
    engine_sampling,
)
from gyre.proxy.types import Sampling
from gyre.runtime.engines import cell_engine_config

RUN = SamplingConfig(**DEFAULTS)  # what gyre run fills in
KW = dict(model_dir="/w/v3", engine_id="cell-1", version=3, seed=77, torch_threads=2)


# ------------------------------------------------------------------ the proxy's rule
def test_unset_fields_pass_the_harness_values_through():
    params, over = engine_sampling(Sampling(temperature=0.0, top_p=0.9, top_k=0), SamplingConfig())
    assert params == {"temperature": 0.0, "top_p": 0.9, "top_k": -1} and over == {}
    assert engine_sampling(Sampling(), SamplingConfig()) == ({}, {})
    assert effective({"top_p": 0.9}) == {**DEFAULTS, "top_p": 0.9}


def test_a_run_fixed_field_overrides_the_harness_and_says_what_it_replaced():
    params, over = engine_sampling(Sampling(temperature=0.7, top_p=0.9, top_k=40, seed=3), RUN)
    assert params == DEFAULTS
    assert over == {"temperature": 0.7, "top_p": 0.9, "top_k": 40}
    # the same values as the run's (top_k 0 is "off", as -1) are not overrides
    assert engine_sampling(Sampling(temperature=1, top_p=1.0, top_k=0), RUN) == (DEFAULTS, {})
    # a run may fix only some fields: the others stay the harness's
    params, over = engine_sampling(Sampling(temperature=0.5, top_p=0.9), SamplingConfig(top_p=0.95))
    assert params == {"temperature": 0.5, "top_p": 0.95} and over == {"top_p": 0.9}


def test_refuse_mode_names_the_parameter():
    refuse = RUN.model_copy(update={"harness_params": "refuse"})
    with pytest.raises(SamplingRefused, match=r"top_p=0.9 differs from this run's top_p=1.0") as e:
        engine_sampling(Sampling(top_p=0.9), refuse)
    assert e.value.param == "top_p"
    assert engine_sampling(Sampling(top_p=1.0, temperature=1.0), refuse) == (DEFAULTS, {})


def test_departures_are_the_fields_off_the_models_own_distribution():
    assert departures(DEFAULTS) == [] and departures({"top_k": 0}) == []
    assert departures({"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05}) == [
        "temperature=0.7",
        "top_p=0.9",
        "top_k=20",
        "min_p=0.05",
    ]


# ------------------------------------------------------------------ what a run accepts
def test_a_run_fixes_its_sampling_so_harness_values_never_pass():
    cfg = load_config(model_dir="/m")
    assert cfg.proxy.sampling.model_dump(exclude={"harness_params"}) == DEFAULTS
    cfg = load_config(model_dir="/m", overrides=["proxy.sampling.harness_params=refuse"])
    assert cfg.proxy.sampling.top_p == 1.0 and cfg.proxy.sampling.harness_params == "refuse"


@pytest.mark.parametrize(
    "sampling",
    ["proxy.sampling.top_p=0.9", "proxy.sampling.top_k=20", "proxy.sampling.min_p=0.1"]
    + ["proxy.sampling.temperature=0.7"],
)
def test_a_biased_distribution_needs_the_recorded_logprob_named(sampling):
    with pytest.raises(ValidationError, match="engine.logprob_mode = 'processed'"):
        load_config(model_dir="/m", overrides=[sampling])
    for mode in ("processed", "raw"):  # named: accepted, and the trainer uses that one
        cfg = load_config(model_dir="/m", overrides=[sampling, f"engine.logprob_mode={mode}"])
        assert cfg.engine.logprob_mode == mode


def test_tempered_is_exact_only_without_a_cut():
    ok = load_config(
        model_dir="/m",
        overrides=["proxy.sampling.temperature=0.7", "engine.logprob_mode=tempered"],
    )
    assert ok.engine.logprob_mode == "tempered"
    with pytest.raises(ValidationError, match="top_p=0.9"):
        load_config(
            model_dir="/m", overrides=["proxy.sampling.top_p=0.9", "engine.logprob_mode=tempered"]
        )


def test_an_accepted_biased_run_round_trips_through_its_dumped_config():
    cfg = load_config(
        model_dir="/m", overrides=["proxy.sampling.top_p=0.9", "engine.logprob_mode=processed"]
    )
    back = GyreConfig.model_validate(cfg.model_dump(mode="json"))
    assert back.proxy.sampling.top_p == 0.9 and back.engine.logprob_mode == "processed"


# ------------------------------------------------------------------ vLLM: logprobs_mode
def test_vllm_launch_maps_the_logprob_mode():
    def flag(cmd: list[str]) -> str:
        return cmd[cmd.index("--logprobs-mode") + 1]

    assert flag(vllm_command("py", "/m", "127.0.0.1", 1)) == "raw_logprobs"
    assert flag(vllm_command("py", "/m", "127.0.0.1", 1, (), "processed")) == "processed_logprobs"
    with pytest.raises(ValueError, match="no vLLM equivalent"):
        vllm_command("py", "/m", "127.0.0.1", 1, (), "tempered")
    assert VllmServer("/m", logprob_mode="processed").logprob_mode == "processed"


def test_vllm_logprob_mode_reaches_the_adapter_from_a_run_and_the_cli(tmp_path):
    cfg = load_config(
        model_dir="/m",
        overrides=[
            "engine.kind=vllm",
            "proxy.sampling.top_p=0.9",
            "engine.logprob_mode=processed",
        ],
    )
    ec = cell_engine_config(cfg.engine, **KW)
    assert isinstance(ec, VllmEngineConfig) and ec.logprob_mode == "processed"
    plain = cell_engine_config(
        load_config(model_dir="/m", overrides=["engine.kind=vllm"]).engine, **KW
    )
    assert isinstance(plain, VllmEngineConfig) and plain.logprob_mode == "raw"
    with pytest.raises(ValidationError, match="no vLLM equivalent"):
        load_config(model_dir="/m", overrides=["engine.kind=vllm", "engine.logprob_mode=tempered"])
    data = {"model_dir": str(tmp_path), "logprob_mode": "processed"}
    got = engine_config("vllm", data, vllm_url="http://127.0.0.1:1")
    assert isinstance(got, VllmEngineConfig) and got.logprob_mode == "processed"
    with pytest.raises(ValidationError, match="logprob_mode"):
        engine_config("vllm", {**data, "logprob_mode": "tempered"}, vllm_url="http://x")
