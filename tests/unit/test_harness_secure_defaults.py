"""The harness sandbox is on by default, its opt-out is explicit, the unsafe mix is refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gyre.config import GyreConfig
from gyre.harness.config import ExecutorConfig


def test_sandbox_is_on_by_default():
    assert ExecutorConfig().sandbox.enabled
    assert ExecutorConfig().scorer.sandbox


def test_sandbox_false_is_the_opt_out():
    assert not ExecutorConfig.model_validate({"sandbox": False}).sandbox.enabled
    assert not ExecutorConfig.model_validate({"sandbox": {"enabled": False}}).sandbox.enabled
    cfg = ExecutorConfig.model_validate({"sandbox": False, "scorer": {"sandbox": False}})
    assert not cfg.sandbox.enabled and not cfg.scorer.sandbox


def test_sandboxed_harness_with_unsandboxed_verifier_is_refused():
    with pytest.raises(ValidationError) as e:
        ExecutorConfig.model_validate({"scorer": {"sandbox": False}})
    msg = str(e.value)
    assert "executor.scorer.sandbox = false with executor.sandbox on runs the verifier" in msg
    assert "executor.sandbox = false" in msg


def test_gyre_run_config_defaults_to_the_sandbox():
    cfg = GyreConfig.model_validate({"model_dir": "m", "engine": {}, "proxy": {}, "trainer": {}})
    assert cfg.executor.sandbox.enabled
    off = GyreConfig.model_validate(
        {"model_dir": "m", "engine": {}, "proxy": {}, "trainer": {}, "executor": {"sandbox": False}}
    )
    assert not off.executor.sandbox.enabled
