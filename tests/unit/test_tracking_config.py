"""``[run.tracking]``: the config section, and the one line a missing tracker library gives
before anything starts."""

from __future__ import annotations

import importlib.util

import pytest
from pydantic import ValidationError

from gyre.runtime.config import RunConfig
from gyre.runtime.tracking_config import TrackingConfig, missing_packages


def test_section_defaults_to_no_sinks_and_refuses_unknown_ones():
    assert RunConfig().tracking.sinks == []
    assert RunConfig.model_validate({"tracking": {"sinks": ["mlflow"]}}).tracking.sinks == [
        "mlflow"
    ]
    with pytest.raises(ValidationError):
        TrackingConfig.model_validate({"sinks": ["neptune"]})
    with pytest.raises(ValidationError):
        TrackingConfig.model_validate({"sink": ["wandb"]})  # a typo is not ignored


@pytest.mark.parametrize(
    ("sinks", "uri", "absent", "line"),
    [
        (["wandb"], None, {"wandb"}, "'wandb' needs wandb, which is not installed"),
        (["wandb", "mlflow"], None, {"alembic"}, "'mlflow' needs alembic, which is not installed"),
        (
            ["mlflow"],
            "file:/tmp/x",
            {"alembic", "sqlalchemy"},
            None,
        ),  # the file store needs neither
        ([], None, {"wandb", "mlflow"}, None),
    ],
)
def test_missing_library_is_one_line(monkeypatch, sinks, uri, absent, line):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name in absent else real(name)
    )
    got = missing_packages(TrackingConfig(sinks=sinks, mlflow_uri=uri))
    if line is None:
        assert got is None
    else:
        assert got is not None and line in got and "\n" not in got
        assert got.startswith("run.tracking.sinks: ") and "gyre[tracking]" in got
