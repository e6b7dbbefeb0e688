"""The suite's xdist work units (tests/helpers/xdist_units.py). Every integration module that
starts ``gyre run`` must be in the one "ray" unit: a new one left out would run beside another
run on CI's 2 cores, where the fault tests' heartbeat and probe deadlines are not made for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.xdist_units import RAY_MODULES, work_unit

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
STARTS_A_RUN = re.compile(r'"gyre\.cli",\s*"run"|^from test_runtime', re.M)


def _modules() -> list[Path]:
    return sorted(INTEGRATION.glob("test_*.py"))


def test_every_module_that_starts_gyre_run_is_in_the_ray_unit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GYRE_TEST_RAY_LANES", raising=False)  # one lane (a suite run may set 2)
    runs = [p.name for p in _modules() if STARTS_A_RUN.search(p.read_text())]
    assert "test_runtime.py" in runs and "test_real_model_example.py" in runs  # the regex works
    for name in runs:
        assert work_unit(f"tests/integration/{name}::test_x") == "ray", name
    assert set(RAY_MODULES) <= {p.name for p in _modules()}  # no stale names


def test_other_modules_are_units_of_their_own() -> None:
    assert work_unit("tests/unit/test_config.py::test_a") == "tests/unit/test_config.py"
    assert work_unit("tests/unit/test_runtime_cli.py::test_a[x-y]") == (
        "tests/unit/test_runtime_cli.py"
    )
    a = work_unit("tests/integration/test_proxy_heartbeat.py::test_a")
    assert a == work_unit("tests/integration/test_proxy_heartbeat.py::test_b") != "ray"


def test_two_lanes_split_the_ray_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GYRE_TEST_RAY_LANES", "2")
    lanes = {work_unit(f"tests/integration/{n}::t") for n in RAY_MODULES}
    assert lanes == {"ray-0", "ray-1"}
    assert work_unit("tests/unit/test_config.py::t") == "tests/unit/test_config.py"
