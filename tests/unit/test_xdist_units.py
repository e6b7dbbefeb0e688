"""The suite's xdist work units (tests/helpers/xdist_units.py). Every integration module that
starts ``gyre run`` must be in the "ray" unit (or the one beside it): a new one left out would run beside
another run on CI's 2 cores, where the fault tests' heartbeat and probe deadlines are not made
for it."""

from __future__ import annotations

import re
from pathlib import Path

from helpers.xdist_units import RAY_BESIDE, RAY_MODULES, order, work_unit

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
STARTS_A_RUN = re.compile(r'"gyre\.cli",\s*"run"|^from test_runtime', re.M)


def _modules() -> list[Path]:
    return sorted(INTEGRATION.glob("test_*.py"))


def test_every_module_that_starts_gyre_run_is_in_the_ray_unit() -> None:
    runs = [p.name for p in _modules() if STARTS_A_RUN.search(p.read_text())]
    assert "test_runtime.py" in runs and "test_real_model_example.py" in runs  # the regex works
    for name in runs:
        unit = work_unit(f"tests/integration/{name}::test_x")
        assert unit == ("ray-beside" if name in RAY_BESIDE else "ray"), name
    assert RAY_BESIDE <= RAY_MODULES <= {p.name for p in _modules()}  # no stale names


def test_the_runs_beside_inject_no_fault() -> None:
    """A module beside the ray unit runs while it runs: none of it kills, stops or hangs a part
    of a run, whose detection deadlines a second run on 2 cores could miss."""
    for name in RAY_BESIDE:
        text = (INTEGRATION / name).read_text()
        assert not re.search(r"chaos|SIGKILL|SIGSTOP|\.kill\(|heartbeat_s", text), name


def test_other_modules_are_units_of_their_own() -> None:
    assert work_unit("tests/unit/test_config.py::test_a") == "tests/unit/test_config.py"
    assert work_unit("tests/unit/test_runtime_cli.py::test_a[x-y]") == (
        "tests/unit/test_runtime_cli.py"
    )
    a = work_unit("tests/integration/test_proxy_heartbeat.py::test_a")
    assert a == work_unit("tests/integration/test_proxy_heartbeat.py::test_b") != "ray"


def test_the_ray_unit_goes_first_then_the_one_beside_it() -> None:
    ids = [
        "tests/unit/test_config.py::t",
        f"tests/integration/{next(iter(RAY_BESIDE))}::t",
        "tests/integration/test_runtime.py::t",
        "tests/integration/test_proxy_heartbeat.py::t",
    ]
    ranked = sorted(ids, key=order)
    assert [work_unit(i) for i in ranked[:2]] == ["ray", "ray-beside"]
    assert ranked[2:] == [ids[0], ids[3]]  # the rest keep their order
