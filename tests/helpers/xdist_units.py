"""The suite's xdist work units (scripts/test.sh runs ``-n 2 --dist loadgroup``; the scheduler
in tests/conftest.py asks :func:`work_unit`). The modules that start ``gyre run`` share one unit
so that two runs never share CI's 2 cores; every other module is a unit of its own."""

from __future__ import annotations

import os

RAY_MODULES = {  # module -> lane when split in two (lanes balanced on measured durations)
    "test_runtime.py": 0,
    "test_runtime_chaos.py": 0,
    "test_runtime_core_restart.py": 0,
    "test_runtime_longtail.py": 0,
    "test_runtime_two_nodes.py": 0,
    "test_real_model_example.py": 1,
    "test_runtime_cpulimit.py": 1,
    "test_runtime_core_inplace.py": 1,
    "test_runtime_cell_faults.py": 1,
    "test_runtime_multirank.py": 1,
    "test_runtime_publication_memory.py": 1,
    "test_runtime_engine_kill.py": 1,
    "test_runtime_vllm.py": 1,
}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: "ray" (or "ray-0"/"ray-1"), or the path of its module."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if path.startswith("tests/integration/") and (
        name in RAY_MODULES or name.startswith("test_runtime")
    ):
        if os.environ.get("GYRE_TEST_RAY_LANES") == "2":
            return f"ray-{RAY_MODULES.get(name, 1)}"
        return "ray"
    return path
